/* `hearthd --bench`: loads a model into the resident int4 engine and measures it in-process,
 * the way the daemon runs it (same loader, same pinned pool): prefill and decode tokens/s for
 * W4A16 and W4A8, and a streaming-read probe on the pool's cores to judge decode against. */
#ifndef HEARTH_DAEMON_MAIN_BENCH_H
#define HEARTH_DAEMON_MAIN_BENCH_H

/* Parses its own options (argv as given to hearthd; --bench itself is accepted and ignored),
 * prints a table or JSON on stdout, and returns the process exit status. */
int main_bench(int argc, char **argv);

#endif
