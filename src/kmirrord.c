/* kmirrord: the daemon's entry point; it only wires the modules together (config, state store, mirror, proxy, signals). */
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <openssl/ssl.h>

#include "kmirror/daemon_config.h"
#include "kmirror/log.h"
#include "kmirror/metrics.h"
#include "kmirror/mirror.h"
#include "kmirror/net.h"
#include "kmirror/proxy.h"
#include "kmirror/state.h"
#include "kmirror/version.h"

#define MAX_OVERRIDES 64

typedef struct daemon_ctx daemon_ctx;

/*
 * One upstream's modules: the state store on it and the mirror module driving its partitions, with
 * the configuration and metrics they use. The first is made at start; an upstream swap makes the
 * next one (prepare), and the proxy releases the previous one once its sessions are gone.
 */
typedef struct upstream_gen {
	daemon_ctx *d;
	km_config cfg;
	km_state *state;
	km_mirror *mirror;
	km_mirror_opts mirror_opts;
	SSL_CTX *tls;        /* the store's client context for the destination */
	km_metrics *metrics; /* a child of the daemon's registry: a swap's modules show as they replace these */
	bool swap;           /* made by a swap: its readiness answers the proxy */
} upstream_gen;

struct daemon_ctx {
	struct event_base *base;
	km_proxy *proxy;
	upstream_gen *gen;   /* the upstream served now */
	km_metrics *metrics;
	km_metric_series *reloads_ok, *reloads_failed;
	const char *config_path;
	const char *override_name[MAX_OVERRIDES];
	const char *override_value[MAX_OVERRIDES];
	int overrides;
	km_config cfg;
	int signals_seen;
	int exit_code;       /* 0, or 1 once the store stopped for good (state_fatal) */
};

/*
 * Keep freed memory for the next reads. kmirrord allocates and frees buffers of up to a few MiB
 * all the time (socket reads, fetched answers, produce requests); glibc's defaults hand blocks
 * above 128 KiB back to the kernel and shrink the heap whenever 128 KiB are free at its top, so the
 * same memory was faulted in and zeroed again for every read: about a third of kmirrord's CPU
 * while a mirror catches up (docs/BENCHMARKS.md, issue 31). Blocks under 32 MiB now come from the
 * heap, which keeps up to 16 MiB free at its top before it shrinks; the peak is what the fetch and
 * buffer sizes bound, as before (docs/mirror.md, "The memory bound").
 */
static void keep_freed_memory(void)
{
#if defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD) && defined(M_TOP_PAD)
	mallopt(M_MMAP_THRESHOLD, 32 << 20);
	mallopt(M_TRIM_THRESHOLD, 16 << 20);
	mallopt(M_TOP_PAD, 1 << 20);
#endif
}

/*
 * What is kept is handed back every TRIM_EVERY_S: the free pages anywhere in the heap, and its top
 * beyond 1 MiB. Without it the kept memory only grew: each burst (a catch-up, a takeover) that
 * needed more than the free blocks at hand raised the heap, and the holes the next burst left
 * between live blocks stayed resident, so RSS climbed in steps over an hour of faults while the
 * memory in use stayed near 1 MiB (docs/reliability.md, "The 66-minute run"). A busy pipeline
 * faults in at most the kept 16 MiB again per period: about 4 ms of CPU every 10 s.
 */
#define TRIM_EVERY_S 10

static void trim_freed_memory(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	malloc_trim(1 << 20);
}

static void usage(FILE *out)
{
	const km_opt_table *t = km_config_table();

	fprintf(out,
		"usage: kmirrord [--config FILE] [--OPTION VALUE ...]\n"
		"Kafka-protocol proxy that fronts a destination cluster and mirrors topics into it.\n"
		"\n"
		"  --config FILE             read options from FILE (key = value lines); flags override it\n"
		"  --listen HOST:PORT        bootstrap listener (listen)\n"
		"  --advertised-host HOST    host returned to clients in broker endpoints (advertised_host)\n"
		"  --broker-port-base PORT   broker node N is served on PORT+N (broker_port_base)\n"
		"  --upstream HOST:PORT[,HOST:PORT...]  upstream cluster bootstrap (upstream)\n"
		"  --http-listen HOST:PORT   /metrics, /readyz, /healthz, /admin/upstream (http_listen)\n"
		"  --admin-listen HOST:PORT  /admin/upstream there only, not on http_listen (admin_listen)\n"
		"  --log-level LEVEL         error, warn, info, debug, trace (log_level)\n"
		"  --check-config            validate the configuration and the files it names, and exit (0 when\n"
		"                            valid; a warning for what is likely wrong)\n"
		"  --print-config            print the effective configuration as a config file and exit\n"
		"  --config-doc              print the option table (Markdown) and exit\n"
		"  --version                 print the version and exit\n"
		"  --help                    this text\n"
		"\n"
		"Every option of the config file is also a flag (--NAME VALUE or --NAME=VALUE, dashes or\n"
		"underscores); see docs/configuration.md. Options, their type and default:\n");
	for (size_t i = 0; i < t->count; i++) {
		const km_option *o = &t->rows[i];
		char flag[64];
		size_t j;
		for (j = 0; o->name[j] && j + 1 < sizeof(flag); j++)
			flag[j] = o->name[j] == '_' ? '-' : o->name[j];
		flag[j] = '\0';
		fprintf(out, "  --%-30s %s, default %s%s\n", flag, km_opt_type_name(o), *o->def ? o->def : "empty",
			o->reloadable ? " (reloadable)" : "");
	}
	fprintf(out, "\nSignals: SIGHUP reloads the config file (kept unchanged when invalid); SIGTERM or SIGINT\n"
		     "drains client connections gradually and exits 0; a second one closes everything at once.\n"
		     "POST /admin/upstream (bearer token of admin_token_file) swaps the upstream cluster, kept in\n"
		     "upstream_file; GET /admin/upstream shows the swap's progress.\n"
		     "Exit codes: 0 after a drain, 1 when it cannot start (listen, TLS files, the secret key file) or\n"
		     "its mirror state topic is unusable (not compacted; after a drain), 2 for a bad command line or\n"
		     "configuration.\n");
}

/* A keytab without the principal's key would fail every connection later, and less clearly. */
static km_err keytab_usable(const km_config *cfg, char *err, size_t errlen)
{
	km_sasl_krb5 k = {cfg->upstream_sasl_kerberos_service_name, cfg->upstream_sasl_kerberos_keytab,
			  cfg->upstream_sasl_kerberos_principal, "upstream_sasl_kerberos_keytab"};

	if (!cfg->upstream_sasl_kerberos_keytab)
		return KM_OK;
	return km_sasl_krb5_check(&k, err, errlen);
}

/* Nor would a token file that is unreadable or holds an expired token, a token endpoint without a client, or a token command that prints no live token. */
static km_err token_usable(const km_config *cfg, char *err, size_t errlen)
{
	km_sasl_oauth o = {cfg->upstream_sasl_oauthbearer_token_endpoint_url, cfg->upstream_sasl_oauthbearer_client_id,
			   cfg->upstream_sasl_oauthbearer_client_secret, cfg->upstream_sasl_oauthbearer_scope,
			   cfg->upstream_sasl_oauthbearer_token_command ? "upstream_sasl_oauthbearer_token_command"
									: "upstream_sasl_oauthbearer_token_endpoint_url",
			   cfg->upstream_sasl_oauthbearer_token_command};

	if (!cfg->upstream_sasl_oauthbearer_token_endpoint_url && !cfg->upstream_sasl_oauthbearer_token_command)
		return KM_OK;
	return km_sasl_oauth_check(&o, err, errlen);
}

/*
 * Build a configuration: defaults, then the file, then the command-line overrides; then the secrets
 * kept in files (not for --print-config, which shows the file's name and no password).
 */

static km_err build_config(daemon_ctx *d, km_config *cfg, bool secrets, char *err, size_t errlen)
{
	km_err rc;
	km_config_init(cfg);
	if (d->config_path && (rc = km_config_load_file(cfg, d->config_path, err, errlen)) != KM_OK)
		goto fail;
	for (int i = 0; i < d->overrides; i++) {
		char sub[400];
		if ((rc = km_config_set(cfg, d->override_name[i], d->override_value[i], sub, sizeof(sub))) != KM_OK) {
			snprintf(err, errlen, "command line: %s", sub);
			goto fail;
		}
	}
	/* A swapped upstream (kept in upstream_file) wins over the upstream option. */
	if ((rc = km_config_apply_upstream_file(cfg, err, errlen)) != KM_OK)
		goto fail;
	if ((rc = km_config_validate(cfg, err, errlen)) != KM_OK)
		goto fail;
	if (secrets && (rc = km_config_read_secrets(cfg, err, errlen)) != KM_OK)
		goto fail;
	if (secrets && (rc = keytab_usable(cfg, err, errlen)) != KM_OK)
		goto fail;
	if (secrets && (rc = token_usable(cfg, err, errlen)) != KM_OK)
		goto fail;
	return KM_OK;
fail:
	km_config_free(cfg);
	return rc;
}

/* A secret given as a flag is in the process list (ps, /proc/PID/cmdline): anyone on the host can read it. */
static void warn_secret_flags(const daemon_ctx *d)
{
	for (int i = 0; i < d->overrides; i++) {
		const km_option *o = km_opt_find(km_config_table(), d->override_name[i]);
		char file[80];
		if (!o || !o->secret || !*d->override_value[i])
			continue;
		snprintf(file, sizeof(file), "%s_file", o->name);
		if (km_opt_find(km_config_table(), file))
			KM_WARN("main", 0, "%s given on the command line is visible to every user of this host in the "
				"process list: put it in a file only kmirrord can read and set %s instead", o->name, file);
		else
			KM_WARN("main", 0, "%s given on the command line is visible to every user of this host in the "
				"process list: set it in the config file instead", o->name);
	}
}

/* The secret files as the start reads them (mode, contents); false with why. */
static bool secrets_usable(km_config *cfg, char *why, size_t len)
{
	if (km_config_read_secrets(cfg, why, len) != KM_OK || keytab_usable(cfg, why, len) != KM_OK)
		return false;
	return !cfg->mirror_secret_key_file ||
	       km_state_key_check(cfg->mirror_secret_key_file, cfg->secret_file_mode_check, why, len) == KM_OK;
}

/* --check-config, after the configuration itself was valid: the files it names, then what is likely wrong. */
static int check_config(km_config *cfg)
{
	char out[8192];
	int rc = 0;

	if (km_config_check_files(cfg, out, sizeof(out)) > 0) {
		fprintf(stderr, "kmirrord: invalid configuration: cannot use these files (run --check-config as the "
				"user kmirrord runs as):\n%s\n", out);
		rc = 2;
	} else if (!secrets_usable(cfg, out, sizeof(out))) {
		/* Read as the start reads them: their mode and their contents, not only that they open. */
		fprintf(stderr, "kmirrord: invalid configuration: %s\n", out);
		rc = 2;
	} else {
		if (km_config_loopback_warning(cfg, out, sizeof(out)))
			fprintf(stderr, "kmirrord: warning: %s\n", out);
		printf("configuration ok\n");
	}
	km_config_free(cfg);
	return rc;
}

static void drained(void *arg)
{
	daemon_ctx *d = arg;
	KM_INFO("main", 0, "drained, exiting");
	event_base_loopexit(d->base, NULL);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	daemon_ctx *d = arg;

	if (sig == SIGHUP) {
		km_config next;
		char err[512];
		if (build_config(d, &next, true, err, sizeof(err)) != KM_OK) {
			km_metric_inc(d->reloads_failed, 1);
			KM_ERROR("main", 0, "reload failed, keeping the running configuration: %s", err);
			return;
		}
		if (km_config_check_reload(&d->cfg, &next, err, sizeof(err)) != KM_OK ||
		    km_proxy_reload(d->proxy, &next, err, sizeof(err)) != KM_OK) {
			km_metric_inc(d->reloads_failed, 1);
			KM_ERROR("main", 0, "reload failed, keeping the running configuration: %s", err);
			km_config_free(&next);
			return;
		}
		km_config_free(&d->cfg);
		d->cfg = next;
		/* The modules read their configuration through the current upstream's copy. */
		if (km_config_copy(&next, &d->cfg) == KM_OK) {
			km_config_free(&d->gen->cfg);
			d->gen->cfg = next;
		}
		km_metric_inc(d->reloads_ok, 1);
		KM_INFO("main", 0, "configuration reloaded");
		return;
	}
	if (++d->signals_seen > 1) {
		KM_WARN("main", 0, "second signal: exiting now");
		event_base_loopbreak(d->base);
		return;
	}
	KM_INFO("main", 0, "signal %d: draining client connections", (int)sig);
	km_proxy_drain(d->proxy, drained, d);
}

/* The registry every module reports into, with the daemon's own reload counters. */
static bool make_metrics(daemon_ctx *d)
{
	static const km_metric_desc reloads = {
		.name = "kmirror_config_reloads_total",
		.help = "SIGHUP reloads.",
		.type = KM_METRIC_COUNTER,
		.labels = {"result"},
	};
	static const char *const ok[] = {"ok"}, *const failed[] = {"failed"};
	km_metric_family *f;

	d->metrics = km_metrics_new();
	if (!d->metrics || !(f = km_metrics_family(d->metrics, &reloads)))
		return false;
	d->reloads_ok = km_metric_series_get(f, ok);
	d->reloads_failed = km_metric_series_get(f, failed);
	return d->reloads_ok && d->reloads_failed;
}

/* The store has read __mirror_state back: mirror RPCs are answered from now on. */
static void state_ready(void *arg)
{
	upstream_gen *g = arg;
	KM_INFO("main", 0, "mirror state ready: %zu mirror(s)", km_state_mirror_count(g->state));
	km_mirror_state_ready(g->mirror);
	km_proxy_state_ready(g->d->proxy, g->state);
	if (g->swap) {
		g->swap = false;
		if (km_proxy_swap_ready(g->d->proxy, g, g->state, g->mirror, KM_OK, NULL)) {
			daemon_ctx *d = g->d;
			d->gen = g;
			memcpy(d->cfg.upstream, g->cfg.upstream, sizeof(d->cfg.upstream));
			d->cfg.upstream_count = g->cfg.upstream_count;
		}
	}
}

/*
 * The store read __mirror_state back again after a failed write: the proxy's requests that came
 * in meanwhile waited for it (unread) and go on now. The mirror learnt what changed from
 * on_partition.
 */
static void state_reread(void *arg)
{
	upstream_gen *g = arg;
	km_proxy_state_ready(g->d->proxy, g->state);
}

/*
 * The store cannot use the state topic (not compacted) and has stopped. A swap's store fails the
 * swap: the daemon keeps fronting the upstream it has. The served upstream's store stops the
 * daemon, after a drain: the proxy would otherwise go on without mirror state (every mirror RPC
 * refused, mirror topics writable by nobody), and a drain, as on SIGTERM, lets clients move to
 * another kmirrord while /readyz already says why (at start there is nobody to drain).
 */
static void state_fatal(void *arg, const char *message)
{
	upstream_gen *g = arg;
	daemon_ctx *d = g->d;

	if (g->swap) {
		g->swap = false;
		km_proxy_swap_ready(d->proxy, g, g->state, g->mirror, KM_MIRROR_STATE_UNAVAILABLE, message);
		return;
	}
	if (g != d->gen) {
		/* A previous upstream's store, kept while its sessions drain: those go on their own. */
		KM_ERROR("main", 0, "the previous upstream's mirror state stopped: %s", message);
		return;
	}
	KM_ERROR("main", 0, "cannot use the mirror state, stopping: %s", message);
	d->exit_code = 1;
	km_proxy_drain(d->proxy, drained, d);
}

static void state_partition(void *arg, const char *mirror, const char *topic, int32_t partition, km_mp_state from,
			    km_mp_state to)
{
	upstream_gen *g = arg;
	km_mirror_partition_changed(g->mirror, mirror, topic, partition, from, to);
}

static void gen_free(upstream_gen *g)
{
	if (!g)
		return;
	/* The store first: the mirror module may still be called back while it goes. */
	if (g->state)
		km_state_free(g->state);
	km_mirror_free(g->mirror);
	SSL_CTX_free(g->tls);
	km_metrics_free(g->metrics);
	km_config_free(&g->cfg);
	free(g);
}

/* The state store on cfg's upstream (the destination), with the mirror module driving its partitions. */
static upstream_gen *gen_new(daemon_ctx *d, const km_config *cfg, bool swap, char *err, size_t errlen)
{
	upstream_gen *g = calloc(1, sizeof(*g));
	km_state_opts o;

	if (!g || km_config_copy(&g->cfg, cfg) != KM_OK) {
		free(g);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	g->d = d;
	g->swap = swap;
	if (!(g->metrics = km_metrics_new_child(d->metrics))) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	/* The destination as the proxy reaches it: the same TLS settings. */
	if (g->cfg.upstream_tls) {
		g->tls = km_state_upstream_tls(&g->cfg, true, err, errlen);
		if (!g->tls)
			goto fail;
	}
	g->mirror_opts.base = d->base;
	g->mirror_opts.cfg = &g->cfg;
	g->mirror_opts.tls = g->tls;
	g->mirror_opts.metrics = g->metrics;
	g->mirror = km_mirror_new(&g->mirror_opts);
	if (!g->mirror) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	memset(&o, 0, sizeof(o));
	o.base = d->base;
	o.dns = NULL;
	o.cfg = &g->cfg;
	o.tls = g->tls;
	o.metrics = g->metrics;
	o.on_ready = state_ready;
	o.on_reread = state_reread;
	o.on_partition = state_partition;
	o.on_fatal = state_fatal;
	o.arg = g;
	g->state = km_state_new(&o, err, errlen);
	if (!g->state)
		goto fail;
	km_mirror_attach(g->mirror, g->state);
	return g;
fail:
	gen_free(g);
	return NULL;
}

/* The proxy's upstream swap: the next upstream's modules, answered from state_ready. */
static void *swap_prepare(void *arg, const km_config *cfg)
{
	daemon_ctx *d = arg;
	char err[512];
	upstream_gen *g = gen_new(d, cfg, true, err, sizeof(err));
	if (!g)
		KM_ERROR("main", 0, "upstream swap: %s", err);
	return g;
}

static void gen_free_cb(evutil_socket_t fd, short what, void *arg)
{
	gen_free(arg);
}

/* Later, not now: the proxy may release a store from inside that store's own callback. */
static void swap_release(void *arg, void *handle)
{
	daemon_ctx *d = arg;
	struct timeval now = {0, 0};
	if (handle == d->gen)
		return;
	if (event_base_once(d->base, -1, EV_TIMEOUT, gen_free_cb, handle, &now) != 0)
		gen_free(handle); /* no memory for the event: at once, as the lesser harm */
}

static const char *flag_to_option(const char *flag, char *buf, size_t len)
{
	size_t i;
	for (i = 0; flag[i] && i + 1 < len; i++)
		buf[i] = flag[i] == '-' ? '_' : flag[i];
	buf[i] = '\0';
	return buf;
}

/* What the command line asks for beyond the options it sets. */
typedef struct cmdline {
	bool check_only, print_only;
} cmdline;

/* The command line into d's overrides. -1: go on; else the exit code (--help, --version, a bad argument). */
static int parse_args(daemon_ctx *d, int argc, char **argv, cmdline *cl)
{
	static char names[MAX_OVERRIDES][64];

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *val;
		char *eq;
		if (!strcmp(a, "--version")) {
			printf("kmirrord %s\n", KM_VERSION);
			return 0;
		}
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		}
		if (!strcmp(a, "--config-doc")) {
			km_opt_write_doc(km_config_table(), stdout);
			return 0;
		}
		if (!strcmp(a, "--check-config")) {
			cl->check_only = true;
			continue;
		}
		if (!strcmp(a, "--print-config")) {
			cl->print_only = true;
			continue;
		}
		if (strncmp(a, "--", 2) != 0 || d->overrides == MAX_OVERRIDES) {
			fprintf(stderr, "kmirrord: unexpected argument '%s' (try --help)\n", a);
			return 2;
		}
		/* --name VALUE or --name=VALUE */
		eq = strchr(a, '=');
		if (eq) {
			size_t n = (size_t)(eq - a - 2);
			char tmp[64];
			if (n >= sizeof(tmp)) {
				fprintf(stderr, "kmirrord: unknown option '%s' (try --help)\n", a);
				return 2;
			}
			memcpy(tmp, a + 2, n);
			tmp[n] = '\0';
			flag_to_option(tmp, names[d->overrides], sizeof(names[0]));
			val = eq + 1;
		} else {
			flag_to_option(a + 2, names[d->overrides], sizeof(names[0]));
			if (i + 1 >= argc) {
				fprintf(stderr, "kmirrord: %s needs a value\n", a);
				return 2;
			}
			val = argv[++i];
		}
		if (!strcmp(names[d->overrides], "config")) {
			d->config_path = val;
			continue;
		}
		if (!km_opt_find(km_config_table(), names[d->overrides])) {
			fprintf(stderr, "kmirrord: unknown option '%s' (try --help)\n", a);
			return 2;
		}
		d->override_name[d->overrides] = names[d->overrides];
		d->override_value[d->overrides] = val;
		d->overrides++;
	}
	return -1;
}

int main(int argc, char **argv)
{
	daemon_ctx d;
	char err[512];
	cmdline cl = {false, false};
	struct event *sig_hup, *sig_term, *sig_int, *trim;
	const struct timeval trim_every = {TRIM_EVERY_S, 0};
	int rc = 0;

	memset(&d, 0, sizeof(d));
	if ((rc = parse_args(&d, argc, argv, &cl)) >= 0)
		return rc;
	rc = 0;
	if (build_config(&d, &d.cfg, !cl.print_only, err, sizeof(err)) != KM_OK) {
		fprintf(stderr, "kmirrord: invalid configuration: %s\n", err);
		return 2;
	}
	if (cl.print_only) {
		km_opt_write_values(km_config_table(), &d.cfg, stdout);
		km_config_free(&d.cfg);
		return 0;
	}
	if (cl.check_only)
		return check_config(&d.cfg);
	km_log_set_level((km_log_level)d.cfg.log_level);
	warn_secret_flags(&d);
	if (km_config_loopback_warning(&d.cfg, err, sizeof(err)))
		KM_WARN("main", 0, "%s", err);
	signal(SIGPIPE, SIG_IGN);
	keep_freed_memory();
	d.base = event_base_new();
	if (!d.base || !make_metrics(&d)) {
		fprintf(stderr, "kmirrord: cannot create the event loop or the metrics registry\n");
		if (d.base)
			event_base_free(d.base);
		km_metrics_free(d.metrics);
		km_config_free(&d.cfg);
		return 1;
	}
	d.proxy = km_proxy_new(d.base, &d.cfg, d.metrics, err, sizeof(err));
	if (d.proxy && !(d.gen = gen_new(&d, &d.cfg, false, err, sizeof(err)))) {
		km_proxy_free(d.proxy);
		d.proxy = NULL;
	}
	if (!d.proxy) {
		KM_ERROR("main", 0, "cannot start: %s", err);
		event_base_free(d.base);
		km_metrics_free(d.metrics);
		km_config_free(&d.cfg);
		return 1;
	}
	km_proxy_set_state(d.proxy, d.gen->state);
	km_proxy_set_mirror(d.proxy, d.gen->mirror);
	{
		km_proxy_swap_ops ops = {swap_prepare, swap_release, &d};
		km_proxy_set_swap_ops(d.proxy, &ops, d.gen);
	}
	sig_hup = evsignal_new(d.base, SIGHUP, on_signal, &d);
	sig_term = evsignal_new(d.base, SIGTERM, on_signal, &d);
	sig_int = evsignal_new(d.base, SIGINT, on_signal, &d);
	trim = event_new(d.base, -1, EV_PERSIST, trim_freed_memory, NULL);
	if (!sig_hup || !sig_term || !sig_int || evsignal_add(sig_hup, NULL) || evsignal_add(sig_term, NULL) ||
	    evsignal_add(sig_int, NULL) || !trim || event_add(trim, &trim_every)) {
		KM_ERROR("main", 0, "cannot install signal handlers or the memory trim timer");
		rc = 1;
	} else {
		KM_INFO("main", 0, "kmirrord %s started", KM_VERSION);
		event_base_dispatch(d.base);
		rc = d.exit_code;
	}
	/* The proxy releases the previous upstreams' modules; the current one's go after it (its hooks
	 * hold the store), before the loop goes (the store's events live there). */
	km_proxy_free(d.proxy);
	gen_free(d.gen);
	if (sig_hup)
		event_free(sig_hup);
	if (sig_term)
		event_free(sig_term);
	if (sig_int)
		event_free(sig_int);
	if (trim)
		event_free(trim);
	/* Let deferred frees (closed connections) run before the base goes. */
	event_base_loop(d.base, EVLOOP_NONBLOCK);
	event_base_free(d.base);
	/* After the proxy: its counters are registered by pointer. */
	km_metrics_free(d.metrics);
	km_config_free(&d.cfg);
	KM_INFO("main", 0, "stopped");
	return rc;
}
