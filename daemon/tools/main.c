/* hearthd-tool: one entry point for the engine's in-process tools, so hearthd's own main
 * does one thing (serve). `hearthd-tool COMMAND [options]`; each command documents itself
 * with --help. */
#include <stdio.h>
#include <string.h>

#include "daemon/tools/tools.h"

struct tool {
	const char *name;
	int (*main)(int argc, char **argv);
	const char *summary;
};

static const struct tool tools[] = {
	{ "run", tool_run, "generate in-process with the f32 reference engine" },
	{ "bench", tool_bench, "measure the int4 engine in-process (prefill, decode, probe)" },
	{ "imatrix", tool_imatrix, "an importance matrix from calibration text (llama-imatrix's GGUF)" },
	{ "render-template", tool_render, "render a chat template over a conversation (JSON)" },
};

static void usage(FILE *to)
{
	fprintf(to, "usage: hearthd-tool COMMAND [options]   (COMMAND --help for its options)\n");
	for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++)
		fprintf(to, "  %-16s %s\n", tools[i].name, tools[i].summary);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(stdout);
		return 0;
	}
	for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++)
		if (!strcmp(argv[1], tools[i].name))
			return tools[i].main(argc - 1, argv + 1);
	fprintf(stderr, "hearthd-tool: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
