/* hearthd's service mode (the default when neither --prompt nor --bench is given). */
#ifndef HEARTH_DAEMON_MAIN_SERVE_H
#define HEARTH_DAEMON_MAIN_SERVE_H

/* Runs the daemon; returns the process exit code. */
int main_serve(int argc, char **argv);

#endif
