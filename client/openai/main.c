/* hearth-openai: an OpenAI-compatible HTTP gateway to hearthd, as its own process so hearthd
 * keeps its no-network sandbox and no HTTP parser runs beside the model. Listens on TCP
 * (loopback by default) and/or a Unix socket, or on the sockets systemd passes; tells systemd
 * when it is ready and pets its watchdog. Options: flags or a config file of `key = value`. */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "client/openai/http.h"

#define GW_LISTEN_DEFAULT "127.0.0.1:8080"
#define GW_MAX_BODY_DEFAULT (8u << 20)
#define GW_LISTENERS_MAX 8

struct option_row {
	const char *key;
	int has_arg;
	const char *help;
};

/* One table of options: the flags, the config file's keys and --help come from it. */
static const struct option_row rows[] = {
	{ "listen", 1, "HOST:PORT for HTTP over TCP, or 'none' (default " GW_LISTEN_DEFAULT ")" },
	{ "unix", 1, "PATH of an HTTP listener on a Unix socket (callers known by uid)" },
	{ "socket", 1, "hearthd's socket (default $HEARTH_SOCKET or " HEARTH_SOCKET_DEFAULT ")" },
	{ "api-keys", 1, "FILE of 'name:key' lines; requests then need 'Authorization: Bearer KEY'" },
	{ "model-name", 1, "the model id /v1/models reports (default: the model's own name)" },
	{ "max-body", 1, "largest request body in bytes (default 8 MiB)" },
	{ "max-connections", 1, "concurrent HTTP connections (default 64)" },
	{ "timeout", 1, "seconds an idle HTTP connection is kept (default 60)" },
	{ "config", 1, "FILE of 'key = value' lines with the keys above" },
	{ "help", 0, "this text" },
};
#define N_ROWS (sizeof rows / sizeof rows[0])

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
	stop_signal = sig;
}

static void usage(FILE *to)
{
	fprintf(to, "usage: hearth-openai [options]\n");
	for (size_t i = 0; i < N_ROWS; i++)
		fprintf(to, "  --%-18s %s\n", rows[i].key, rows[i].help);
}

static char *dup_or_die(const char *s)
{
	char *d = strdup(s);
	if (!d) {
		fprintf(stderr, "hearth-openai: out of memory\n");
		exit(1);
	}
	return d;
}

static int set_option(struct gw_config *c, const char *key, const char *val, const char *where)
{
	char *end;
	unsigned long long n;
	if (!strcmp(key, "listen"))
		c->listen = strcmp(val, "none") ? dup_or_die(val) : "";
	else if (!strcmp(key, "unix"))
		c->unix_path = dup_or_die(val);
	else if (!strcmp(key, "socket"))
		c->hearth_socket = dup_or_die(val);
	else if (!strcmp(key, "api-keys"))
		c->api_keys = dup_or_die(val);
	else if (!strcmp(key, "model-name"))
		c->model_name = dup_or_die(val);
	else if (!strcmp(key, "max-body") || !strcmp(key, "max-connections") || !strcmp(key, "timeout")) {
		errno = 0;
		n = strtoull(val, &end, 10);
		if (errno || end == val || *end || n == 0 || n > (1ull << 30)) {
			fprintf(stderr, "hearth-openai: %s: %s '%s' is not an integer in 1..%llu\n", where, key, val,
				1ull << 30);
			return -1;
		}
		if (!strcmp(key, "max-body"))
			c->max_body = (size_t)n;
		else if (!strcmp(key, "max-connections"))
			c->max_connections = (unsigned)n;
		else
			c->timeout_s = (unsigned)n;
	} else {
		fprintf(stderr, "hearth-openai: %s: unknown key '%s'\n", where, key);
		return -1;
	}
	return 0;
}

static int load_config(struct gw_config *c, const char *path)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		fprintf(stderr, "hearth-openai: %s: %s\n", path, strerror(errno));
		return -1;
	}
	char line[1024], where[1100];
	unsigned n = 0;
	int rc = 0;
	while (rc == 0 && fgets(line, sizeof line, f)) {
		n++;
		line[strcspn(line, "\r\n")] = 0;
		char *s = line + strspn(line, " \t");
		if (!*s || *s == '#')
			continue;
		char *eq = strchr(s, '=');
		snprintf(where, sizeof where, "%s:%u", path, n);
		if (!eq || eq == s) {
			fprintf(stderr, "hearth-openai: %s: expected 'key = value'\n", where);
			rc = -1;
			break;
		}
		char *k_end = eq;
		while (k_end > s && (k_end[-1] == ' ' || k_end[-1] == '\t'))
			k_end--;
		*k_end = 0;
		char *v = eq + 1 + strspn(eq + 1, " \t");
		size_t vl = strlen(v);
		while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
			v[--vl] = 0;
		for (char *p = s; *p; p++)
			if (*p == '_')
				*p = '-';
		if (!strcmp(s, "config")) {
			fprintf(stderr, "hearth-openai: %s: 'config' cannot be set in a config file\n", where);
			rc = -1;
		} else {
			rc = set_option(c, s, v, where);
		}
	}
	fclose(f);
	return rc;
}

static int parse_args(int argc, char **argv, struct gw_config *c)
{
	struct option lo[N_ROWS + 1];
	for (size_t i = 0; i < N_ROWS; i++)
		lo[i] = (struct option){ rows[i].key, rows[i].has_arg ? required_argument : no_argument, NULL, (int)i + 256 };
	memset(&lo[N_ROWS], 0, sizeof lo[N_ROWS]);

	/* The config file first, so flags override it whatever their order. */
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], "--config=", 9) && load_config(c, argv[i] + 9) < 0)
			return -1;
		else if (!strcmp(argv[i], "--config") && i + 1 < argc && load_config(c, argv[++i]) < 0)
			return -1;
	int ch;
	while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		if (ch == 'h' || (ch >= 256 && !strcmp(rows[ch - 256].key, "help"))) {
			usage(stdout);
			exit(0);
		}
		if (ch < 256) {
			usage(stderr);
			return -1;
		}
		if (!strcmp(rows[ch - 256].key, "config"))
			continue;
		if (set_option(c, rows[ch - 256].key, optarg, "command line") < 0)
			return -1;
	}
	if (optind < argc) {
		fprintf(stderr, "hearth-openai: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	return 0;
}

static int listen_tcp(const char *spec)
{
	char host[256];
	const char *colon = strrchr(spec, ':');
	if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof host || !colon[1]) {
		fprintf(stderr, "hearth-openai: listen '%s' is not HOST:PORT\n", spec);
		return -1;
	}
	memcpy(host, spec, (size_t)(colon - spec));
	host[colon - spec] = 0;
	if (host[0] == '[' && host[strlen(host) - 1] == ']') { /* [::1]:8080 */
		memmove(host, host + 1, strlen(host));
		host[strlen(host) - 1] = 0;
	}
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *ai;
	int e = getaddrinfo(host, colon + 1, &hints, &ai);
	if (e) {
		fprintf(stderr, "hearth-openai: listen '%s': %s\n", spec, gai_strerror(e));
		return -1;
	}
	int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0), one = 1;
	if (fd >= 0)
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 128) < 0) {
		fprintf(stderr, "hearth-openai: listen '%s': %s\n", spec, strerror(errno));
		if (fd >= 0)
			close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd >= 0) {
		/* Say where: with port 0 (tests) the kernel chose it. */
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		char h[NI_MAXHOST], p[NI_MAXSERV];
		if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
		    getnameinfo((struct sockaddr *)&ss, sl, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV) == 0)
			fprintf(stderr, "hearth-openai: listening on %s%s%s:%s\n", ss.ss_family == AF_INET6 ? "[" : "", h,
				ss.ss_family == AF_INET6 ? "]" : "", p);
	}
	return fd;
}

static int listen_unix(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof sa.sun_path) {
		fprintf(stderr, "hearth-openai: unix socket path '%s' is too long\n", path);
		return -1;
	}
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	/* Replace only a stale socket: one that answers belongs to a running gateway. */
	struct stat st;
	if (fd >= 0 && lstat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
		int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0) {
			fprintf(stderr, "hearth-openai: %s: another gateway is listening there\n", path);
			close(probe);
			close(fd);
			return -1;
		}
		if (probe >= 0)
			close(probe);
		unlink(path);
	}
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 128) < 0) {
		fprintf(stderr, "hearth-openai: unix socket %s: %s\n", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	chmod(path, 0666);
	return fd;
}

/* The model id clients see: the configured one, or the model's own name from a welcome. */
static void resolve_model_id(struct gw *g)
{
	snprintf(g->model_id, sizeof g->model_id, "%s", g->cfg.model_name ? g->cfg.model_name : "hearth");
	if (g->cfg.model_name)
		return;
	struct hearth_connect_opts o = { .socket_path = g->cfg.hearth_socket, .client_name = "openai",
					 .timeout_ms = 5000 };
	struct hearth *h;
	struct hearth_model m;
	if (hearth_connect_with(&h, &o, NULL) < 0)
		return;
	if (hearth_model_info(h, &m, NULL) == 0)
		snprintf(g->model_id, sizeof g->model_id, "%s", m.name[0] ? m.name : m.arch);
	hearth_close(h);
}

int main(int argc, char **argv)
{
	static struct gw g; /* large (keys table): not on the stack */
	g.cfg = (struct gw_config){ .listen = GW_LISTEN_DEFAULT, .max_body = GW_MAX_BODY_DEFAULT,
				    .max_connections = 64, .timeout_s = 60 };
	if (parse_args(argc, argv, &g.cfg) < 0)
		return 2;
	char msg[512];
	if (g.cfg.api_keys && gw_keys_load(&g, g.cfg.api_keys, msg, sizeof msg) < 0) {
		fprintf(stderr, "hearth-openai: %s\n", msg);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	int fds[GW_LISTENERS_MAX], n_fds = 0;
	int n_sd = sd_listen_fds(1);
	if (n_sd > GW_LISTENERS_MAX) {
		fprintf(stderr, "hearth-openai: systemd passed %d sockets, at most %d are served\n", n_sd,
			GW_LISTENERS_MAX);
		return 1;
	}
	for (int i = 0; i < n_sd; i++) {
		if (sd_is_socket(SD_LISTEN_FDS_START + i, AF_UNSPEC, SOCK_STREAM, 1) <= 0) {
			fprintf(stderr, "hearth-openai: systemd's fd %d is not a listening stream socket\n",
				SD_LISTEN_FDS_START + i);
			return 1;
		}
		fds[n_fds++] = SD_LISTEN_FDS_START + i;
	}
	if (n_sd <= 0) {
		if (g.cfg.listen[0] && (fds[n_fds] = listen_tcp(g.cfg.listen)) >= 0)
			n_fds++;
		else if (g.cfg.listen[0])
			return 1;
		if (g.cfg.unix_path && (fds[n_fds] = listen_unix(g.cfg.unix_path)) >= 0)
			n_fds++;
		else if (g.cfg.unix_path)
			return 1;
	}
	if (n_fds == 0) {
		fprintf(stderr, "hearth-openai: nothing to listen on (--listen none and no --unix)\n");
		return 1;
	}
	g.started = (int64_t)time(NULL);
	resolve_model_id(&g);

	struct MHD_Daemon *d[GW_LISTENERS_MAX];
	for (int i = 0; i < n_fds; i++) {
		d[i] = gw_http_start(&g, fds[i], msg, sizeof msg);
		if (!d[i]) {
			fprintf(stderr, "hearth-openai: %s\n", msg);
			return 1;
		}
	}
	sd_notifyf(0, "READY=1\nSTATUS=serving %s for %d listener(s)", g.model_id, n_fds);
	fprintf(stderr, "hearth-openai: serving model '%s' on %d listener(s)\n", g.model_id, n_fds);

	uint64_t wd_usec = 0;
	bool wd = sd_watchdog_enabled(0, &wd_usec) > 0;
	while (!stop_signal) {
		/* The HTTP threads belong to libmicrohttpd; this one only keeps the watchdog fed. */
		usleep(wd ? (useconds_t)(wd_usec / 3 < 1000000 ? wd_usec / 3 : 1000000) : 200000);
		if (wd)
			sd_notify(0, "WATCHDOG=1");
	}
	sd_notify(0, "STOPPING=1");
	for (int i = 0; i < n_fds; i++)
		MHD_stop_daemon(d[i]);
	if (g.cfg.unix_path && n_sd <= 0)
		unlink(g.cfg.unix_path);
	return 0;
}
