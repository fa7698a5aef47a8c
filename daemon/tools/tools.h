/* hearthd-tool's commands: the engine run in-process, without the service. Each parses its
 * own options (argv[0] is the command's name) and returns the process exit status. */
#ifndef HEARTH_DAEMON_TOOLS_TOOLS_H
#define HEARTH_DAEMON_TOOLS_TOOLS_H

/* `run`: generation with the f32 reference engine, printed as it is sampled. */
int tool_run(int argc, char **argv);

/* `bench`: loads a model into the resident int4 engine and measures it the way the daemon
 * runs it (same loader, same pinned pool): prefill and decode tokens/s for W4A16 and W4A8,
 * and a streaming-read probe on the pool's cores to judge decode against. */
int tool_bench(int argc, char **argv);

/* `render-template`: a chat template rendered over a conversation (JSON files). */
int tool_render(int argc, char **argv);

#endif
