// Command-line parsing the node benches share: --name N for positive integers, --name WORD
// for strings, --name alone for flags, everything else positional. Unknown options and bad
// numbers are errors that name the option.
export function parseArgs(argv, defaults, { ints = [], strings = [], flags = [] } = {}) {
	const o = { ...defaults, args: [] };
	const key = (a) => a.slice(2);
	for (let i = 0; i < argv.length; i++) {
		const a = argv[i];
		if (ints.includes(key(a))) {
			const v = Number(argv[++i]);
			if (!Number.isInteger(v) || v < 1)
				throw new Error(`${a} needs a positive integer`);
			o[key(a)] = v;
		} else if (strings.includes(key(a))) {
			if (i + 1 >= argv.length)
				throw new Error(`${a} needs a value`);
			o[key(a)] = argv[++i];
		} else if (flags.includes(key(a))) {
			o[key(a)] = true;
		} else if (a.startsWith("--")) {
			throw new Error(`unknown option ${a}`);
		} else {
			o.args.push(a);
		}
	}
	return o;
}
