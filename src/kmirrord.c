/* kmirrord: the daemon's entry point; it only wires the modules together (config, state store, mirror, proxy, signals). */
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

typedef struct daemon_ctx {
	struct event_base *base;
	km_proxy *proxy;
	km_state *state;
	km_mirror *mirror;
	km_mirror_opts mirror_opts;
	SSL_CTX *state_tls;       /* the store's client context for the destination */
	km_metrics *metrics;
	km_metric_series *reloads_ok, *reloads_failed;
	const char *config_path;
	const char *override_name[MAX_OVERRIDES];
	const char *override_value[MAX_OVERRIDES];
	int overrides;
	km_config cfg;
	int signals_seen;
} daemon_ctx;

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
		"  --http-listen HOST:PORT   /metrics and /healthz endpoint (http_listen)\n"
		"  --log-level LEVEL         error, warn, info, debug, trace (log_level)\n"
		"  --check-config            validate the configuration and exit (0 when valid)\n"
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
		     "Exit codes: 0 after a drain, 1 when it cannot start (listen, TLS files), 2 for a bad\n"
		     "command line or configuration.\n");
}

/* Build a configuration: defaults, then the file, then the command-line overrides. */
static km_err build_config(daemon_ctx *d, km_config *cfg, char *err, size_t errlen)
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
	if ((rc = km_config_validate(cfg, err, errlen)) != KM_OK)
		goto fail;
	return KM_OK;
fail:
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
		if (build_config(d, &next, err, sizeof(err)) != KM_OK) {
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
	daemon_ctx *d = arg;
	KM_INFO("main", 0, "mirror state ready: %zu mirror(s)", km_state_mirror_count(d->state));
	km_mirror_state_ready(d->mirror);
}

static void state_partition(void *arg, const char *mirror, const char *topic, int32_t partition, km_mp_state from,
			    km_mp_state to)
{
	daemon_ctx *d = arg;
	km_mirror_partition_changed(d->mirror, mirror, topic, partition, from, to);
}

/* The state store on the destination, with the mirror module driving its partitions. */
static bool make_state(daemon_ctx *d, char *err, size_t errlen)
{
	km_state_opts o;

	/* The destination as the proxy reaches it: the same TLS settings. */
	if (d->cfg.upstream_tls) {
		d->state_tls = km_net_tls_client_ctx(d->cfg.upstream_tls_ca_file, d->cfg.upstream_tls_cert_file,
						     d->cfg.upstream_tls_key_file, true, err, errlen);
		if (!d->state_tls)
			return false;
	}
	memset(&d->mirror_opts, 0, sizeof(d->mirror_opts));
	d->mirror_opts.base = d->base;
	d->mirror_opts.cfg = &d->cfg;
	d->mirror_opts.tls = d->state_tls;
	d->mirror_opts.metrics = d->metrics;
	d->mirror = km_mirror_new(&d->mirror_opts);
	if (!d->mirror) {
		snprintf(err, errlen, "out of memory");
		return false;
	}
	memset(&o, 0, sizeof(o));
	o.base = d->base;
	o.dns = NULL;
	o.cfg = &d->cfg;
	o.tls = d->state_tls;
	o.metrics = d->metrics;
	o.on_ready = state_ready;
	o.on_partition = state_partition;
	o.arg = d;
	d->state = km_state_new(&o, err, errlen);
	if (!d->state)
		return false;
	km_mirror_attach(d->mirror, d->state);
	return true;
}

static const char *flag_to_option(const char *flag, char *buf, size_t len)
{
	size_t i;
	for (i = 0; flag[i] && i + 1 < len; i++)
		buf[i] = flag[i] == '-' ? '_' : flag[i];
	buf[i] = '\0';
	return buf;
}

int main(int argc, char **argv)
{
	daemon_ctx d;
	char err[512];
	bool check_only = false, print_only = false;
	struct event *sig_hup, *sig_term, *sig_int;
	static char names[MAX_OVERRIDES][64];
	int rc = 0;

	memset(&d, 0, sizeof(d));
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
			check_only = true;
			continue;
		}
		if (!strcmp(a, "--print-config")) {
			print_only = true;
			continue;
		}
		if (strncmp(a, "--", 2) != 0 || d.overrides == MAX_OVERRIDES) {
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
			flag_to_option(tmp, names[d.overrides], sizeof(names[0]));
			val = eq + 1;
		} else {
			flag_to_option(a + 2, names[d.overrides], sizeof(names[0]));
			if (i + 1 >= argc) {
				fprintf(stderr, "kmirrord: %s needs a value\n", a);
				return 2;
			}
			val = argv[++i];
		}
		if (!strcmp(names[d.overrides], "config")) {
			d.config_path = val;
			continue;
		}
		if (!km_opt_find(km_config_table(), names[d.overrides])) {
			fprintf(stderr, "kmirrord: unknown option '%s' (try --help)\n", a);
			return 2;
		}
		d.override_name[d.overrides] = names[d.overrides];
		d.override_value[d.overrides] = val;
		d.overrides++;
	}
	if (build_config(&d, &d.cfg, err, sizeof(err)) != KM_OK) {
		fprintf(stderr, "kmirrord: invalid configuration: %s\n", err);
		return 2;
	}
	if (check_only || print_only) {
		if (print_only)
			km_opt_write_values(km_config_table(), &d.cfg, stdout);
		else
			printf("configuration ok\n");
		km_config_free(&d.cfg);
		return 0;
	}
	km_log_set_level((km_log_level)d.cfg.log_level);
	signal(SIGPIPE, SIG_IGN);
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
	if (d.proxy && !make_state(&d, err, sizeof(err))) {
		km_proxy_free(d.proxy);
		d.proxy = NULL;
	}
	if (!d.proxy) {
		KM_ERROR("main", 0, "cannot start: %s", err);
		if (d.state)
			km_state_free(d.state);
		km_mirror_free(d.mirror);
		SSL_CTX_free(d.state_tls);
		event_base_free(d.base);
		km_metrics_free(d.metrics);
		km_config_free(&d.cfg);
		return 1;
	}
	km_proxy_set_state(d.proxy, d.state);
	km_proxy_set_mirror(d.proxy, d.mirror);
	sig_hup = evsignal_new(d.base, SIGHUP, on_signal, &d);
	sig_term = evsignal_new(d.base, SIGTERM, on_signal, &d);
	sig_int = evsignal_new(d.base, SIGINT, on_signal, &d);
	if (!sig_hup || !sig_term || !sig_int || evsignal_add(sig_hup, NULL) || evsignal_add(sig_term, NULL) ||
	    evsignal_add(sig_int, NULL)) {
		KM_ERROR("main", 0, "cannot install signal handlers");
		rc = 1;
	} else {
		KM_INFO("main", 0, "kmirrord %s started", KM_VERSION);
		event_base_dispatch(d.base);
	}
	km_proxy_free(d.proxy);
	/* After the proxy (its hooks hold the store), before the loop goes (the store's events live there). */
	if (d.state)
		km_state_free(d.state);
	km_mirror_free(d.mirror);
	SSL_CTX_free(d.state_tls);
	if (sig_hup)
		event_free(sig_hup);
	if (sig_term)
		event_free(sig_term);
	if (sig_int)
		event_free(sig_int);
	/* Let deferred frees (closed connections) run before the base goes. */
	event_base_loop(d.base, EVLOOP_NONBLOCK);
	event_base_free(d.base);
	/* After the proxy: its counters are registered by pointer. */
	km_metrics_free(d.metrics);
	km_config_free(&d.cfg);
	KM_INFO("main", 0, "stopped");
	return rc;
}
