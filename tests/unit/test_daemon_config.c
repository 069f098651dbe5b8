/* Unit tests for the daemon's option table: defaults, parsing, files, validation, reload rules, the doc. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "kmirror/daemon_config.h"
#include "kmirror/log.h"
#include "kmirror/net.h"
#include "unit_doc.h"
#include "unit_tmpfile.h"

static void test_defaults_round_trip(void **state)
{
	km_config cfg;
	const km_opt_table *t = km_config_table();
	const km_option *opts = t->rows;
	size_t n = t->count;
	char err[256];

	assert_true(n >= 20);
	km_config_init(&cfg);
	for (size_t i = 0; i < n; i++) {
		char v[512];
		/* Every default parses, and formats back to the text in the table. */
		km_opt_format(&opts[i], &cfg, v, sizeof(v));
		assert_string_equal(v, opts[i].def);
		assert_non_null(opts[i].doc);
		assert_true(strlen(opts[i].doc) > 10);
		for (size_t j = 0; j < i; j++)
			assert_string_not_equal(opts[i].name, opts[j].name);
	}
	assert_int_equal(cfg.broker_port_base, 19092);
	assert_int_equal(cfg.listen.port, 9092);
	assert_int_equal(cfg.log_level, KM_LOG_INFO);
	/* Defaults alone are not runnable: an upstream is required. */
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "upstream"));
	km_config_free(&cfg);
}

static void test_set_values(void **state)
{
	km_config cfg;
	char err[256];

	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "a:1, b:2,[::1]:3", err, sizeof(err)), KM_OK);
	assert_int_equal(cfg.upstream_count, 3);
	assert_string_equal(cfg.upstream[1].host, "b");
	assert_string_equal(cfg.upstream[2].host, "::1");
	assert_int_equal(cfg.upstream[2].port, 3);
	assert_int_equal(km_config_set(&cfg, "upstream", "nohost", err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(cfg.upstream_count, 3); /* a failed set changes nothing */
	assert_int_equal(km_config_set(&cfg, "max_frame_bytes", "12x", err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "max_frame_bytes", "10", err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "out of range"));
	assert_int_equal(km_config_set(&cfg, "max_frame_bytes", "1048576", err, sizeof(err)), KM_OK);
	assert_int_equal(cfg.max_frame_bytes, 1048576);
	assert_int_equal(km_config_set(&cfg, "upstream_tls", "yes", err, sizeof(err)), KM_OK);
	assert_true(cfg.upstream_tls);
	assert_int_equal(km_config_set(&cfg, "upstream_tls", "maybe", err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "log_level", "debug", err, sizeof(err)), KM_OK);
	assert_int_equal(cfg.log_level, KM_LOG_DEBUG);
	assert_int_equal(km_config_set(&cfg, "log_level", "loud", err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "tls_client_auth", "required", err, sizeof(err)), KM_OK);
	assert_int_equal(cfg.tls_client_auth, KM_TLS_CLIENT_AUTH_REQUIRED);
	assert_int_equal(km_config_set(&cfg, "no_such_option", "1", err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "no_such_option"));
	assert_int_equal(km_config_set(&cfg, "listen", "0.0.0.0:70000", err, sizeof(err)), KM_ERR_CONFIG);
	km_config_free(&cfg);
}

static void test_load_file(void **state)
{
	km_config cfg;
	char err[256];
	char *ok = write_tmp("# comment\n\nlisten = 127.0.0.1:7000\nupstream=k1:9092,k2:9092\n"
			     "advertised_host = \"proxy.example\"\n  idle_timeout_ms = 5000  \n");
	char *bad = write_tmp("listen = 127.0.0.1:7000\nthis line has no equals sign\n");
	char *unknown = write_tmp("upstream = k:1\nbogus = 3\n");

	km_config_init(&cfg);
	assert_int_equal(km_config_load_file(&cfg, ok, err, sizeof(err)), KM_OK);
	assert_int_equal(cfg.listen.port, 7000);
	assert_int_equal(cfg.upstream_count, 2);
	assert_string_equal(cfg.advertised_host, "proxy.example");
	assert_int_equal(cfg.idle_timeout_ms, 5000);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_load_file(&cfg, bad, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, ":2:"));
	assert_int_equal(km_config_load_file(&cfg, unknown, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "bogus"));
	assert_int_equal(km_config_load_file(&cfg, "/nonexistent/kmirrord.conf", err, sizeof(err)), KM_ERR_CONFIG);
	km_config_free(&cfg);
	unlink(ok);
	unlink(bad);
	unlink(unknown);
	free(ok);
	free(bad);
	free(unknown);
}

/*
 * Every host:port option (listen, upstream, http_listen, admin_listen): what the parser accepts,
 * --print-config prints so that it loads back to the same value; a host with a bracket inside, a
 * blank or a sign in the port is refused by name.
 */
static void test_hostport_options(void **state)
{
	static const char *const bad[] = {"K::1]:8080", "[[::1]:8080", "[::1]]:8080", "[a[b]:8080", "a]b:8080",
					  "a[b:8080", "[]:8080", "h :8080", "h\t:8080", "a b:8080", "h:+8080",
					  "h: 8080", "h:0x10", "h:99999999999999999999"};
	/* Blanks around an entry separate a list's entries; around a single host:port they are refused. */
	static const char *const bad_one[] = {" h:8080", "h:8080 "};
	static const char *const good[][2] = {
		{"[::1]:8080", "[::1]:8080"},
		{"::1:8080", "[::1]:8080"}, /* unbracketed: the last colon is the port's */
		{"[fe80::1%eth0]:9092", "[fe80::1%eth0]:9092"},
		{"[kafka-1]:9092", "kafka-1:9092"},
		{"k_1.example.com:1", "k_1.example.com:1"},
		{"10.0.0.1:65535", "10.0.0.1:65535"},
	};
	const km_opt_table *t = km_config_table();
	size_t rows = 0;
	char err[512];

	for (size_t i = 0; i < t->count; i++) {
		const km_option *o = &t->rows[i];
		km_config cfg, back;
		char *path;
		FILE *f;

		if (o->type != KM_OPT_HOSTPORT && o->type != KM_OPT_HOSTPORT_LIST)
			continue;
		rows++;
		km_config_init(&cfg);
		for (size_t j = 0; j < sizeof(bad) / sizeof(bad[0]); j++) {
			if (km_config_set(&cfg, o->name, bad[j], err, sizeof(err)) != KM_ERR_CONFIG)
				fail_msg("%s = '%s' was accepted", o->name, bad[j]);
			assert_non_null(strstr(err, o->name));
			assert_non_null(strstr(err, "is not host:port"));
		}
		for (size_t j = 0; o->type == KM_OPT_HOSTPORT && j < sizeof(bad_one) / sizeof(bad_one[0]); j++)
			if (km_config_set(&cfg, o->name, bad_one[j], err, sizeof(err)) != KM_ERR_CONFIG)
				fail_msg("%s = '%s' was accepted", o->name, bad_one[j]);
		for (size_t j = 0; j < sizeof(good) / sizeof(good[0]); j++) {
			char v[300];
			assert_int_equal(km_config_set(&cfg, o->name, good[j][0], err, sizeof(err)), KM_OK);
			km_opt_format(o, &cfg, v, sizeof(v));
			assert_string_equal(v, good[j][1]);
			/* --print-config's file loads back to the same value. */
			path = write_tmp("");
			assert_non_null(f = fopen(path, "w"));
			km_opt_write_values(t, &cfg, f);
			assert_int_equal(fclose(f), 0);
			km_config_init(&back);
			if (km_config_load_file(&back, path, err, sizeof(err)) != KM_OK)
				fail_msg("%s = '%s' printed as '%s' does not load: %s", o->name, good[j][0], v, err);
			assert_true(km_opt_equal(o, &cfg, &back));
			km_config_free(&back);
			unlink(path);
			free(path);
		}
		km_config_free(&cfg);
	}
	assert_int_equal(rows, 4);

	/* The file the fuzzer found: refused at its line, naming what is wrong. */
	{
		char *path = write_tmp("upstream = k:9092\nhttp_listen = K::1]:8080\n");
		km_config cfg;
		km_config_init(&cfg);
		assert_int_equal(km_config_load_file(&cfg, path, err, sizeof(err)), KM_ERR_CONFIG);
		assert_non_null(strstr(err, ":2: http_listen: 'K::1]:8080' is not host:port"));
		km_config_free(&cfg);
		unlink(path);
		free(path);
	}
}

/* --print-config's file, loaded back: every option the same (secrets aside: they are masked). */
static void assert_prints_back(const km_config *cfg)
{
	const km_opt_table *t = km_config_table();
	char *path = write_tmp(""), err[512];
	km_config back;
	FILE *f;

	assert_non_null(f = fopen(path, "w"));
	km_opt_write_values(t, cfg, f);
	assert_int_equal(fclose(f), 0);
	km_config_init(&back);
	if (km_config_load_file(&back, path, err, sizeof(err)) != KM_OK)
		fail_msg("--print-config's output does not load: %s", err);
	for (size_t i = 0; i < t->count; i++)
		if (!t->rows[i].secret && !km_opt_equal(&t->rows[i], cfg, &back))
			fail_msg("%s loads back as another value", t->rows[i].name);
	km_config_free(&back);
	unlink(path);
	free(path);
}

/*
 * Long values print whole: a string of 5000 characters, 32 upstream entries of 250-character hosts
 * (8 KB); a line just under 4 KB, which " = " makes longer when printed, loads back.
 */
static void test_print_config_long_values(void **state)
{
	static char value[5001], list[KM_CONFIG_MAX_UPSTREAMS * 260], line[4096];
	size_t n = 0;
	km_config cfg;
	char err[512], *path;
	(void)state;

	memset(value, 'u', sizeof(value) - 1);
	for (int i = 0; i < KM_CONFIG_MAX_UPSTREAMS; i++) {
		n += (size_t)snprintf(list + n, sizeof(list) - n, "%sh%02d", i ? "," : "", i);
		memset(list + n, 'x', 247);
		n += 247;
		n += (size_t)snprintf(list + n, sizeof(list) - n, ":9092");
	}
	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_username", value, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream", list, err, sizeof(err)), KM_OK);
	assert_int_equal(cfg.upstream_count, KM_CONFIG_MAX_UPSTREAMS);
	assert_int_equal(strlen(cfg.upstream[31].host), 250);
	assert_prints_back(&cfg);
	km_config_free(&cfg);

	/* "upstream_sasl_username=uuu...": 4094 characters and the newline. */
	n = (size_t)snprintf(line, sizeof(line), "upstream_sasl_username=");
	memset(line + n, 'u', sizeof(line) - 2 - n);
	line[sizeof(line) - 2] = '\n';
	path = write_tmp(line);
	km_config_init(&cfg);
	assert_int_equal(km_config_load_file(&cfg, path, err, sizeof(err)), KM_OK);
	assert_int_equal(strlen(cfg.upstream_sasl_username), sizeof(line) - 2 - n);
	assert_prints_back(&cfg);
	km_config_free(&cfg);
	unlink(path);
	free(path);
}

static void test_validate(void **state)
{
	km_config cfg;
	char err[256];

	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "k:9092", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	/* listen port inside the broker range */
	assert_int_equal(km_config_set(&cfg, "listen", "0.0.0.0:19100", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "listen", "0.0.0.0:9092", err, sizeof(err)), KM_OK);
	/* broker range past 65535 */
	assert_int_equal(km_config_set(&cfg, "broker_port_base", "65000", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "broker_port_count", "100", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	/* TLS files in pairs */
	assert_int_equal(km_config_set(&cfg, "tls_cert_file", "/x.pem", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "tls_key_file", "/x.key", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "tls_client_auth", "required", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "tls_ca_file", "/ca.pem", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	/* upstream TLS files without upstream_tls */
	assert_int_equal(km_config_set(&cfg, "upstream_tls_ca_file", "/ca.pem", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	km_config_free(&cfg);
}

/* admin_listen apart from the other listeners; its TLS files in a pair, and only with it. */
static void test_validate_admin_listen(void **state)
{
	km_config cfg;
	char err[256];

	(void)state;
	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "k:9092", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "http_listen", "0.0.0.0:9644", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "admin_listen", "0.0.0.0:9644", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "admin_listen"));
	assert_int_equal(km_config_set(&cfg, "admin_listen", "0.0.0.0:9092", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "admin_listen", "127.0.0.1:9644", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "admin_tls_cert_file", "/a.pem", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "admin_tls_key_file", "/a.key", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "admin_listen", "", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "admin_listen"));
	/* the caps' defaults, and 0 for none */
	assert_int_equal(cfg.max_connections, 10000);
	assert_int_equal(cfg.max_connections_per_ip, 1000);
	assert_int_equal(km_config_set(&cfg, "max_connections_per_ip", "0", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "http_max_headers", "0", err, sizeof(err)), KM_ERR_CONFIG);
	km_config_free(&cfg);
}

static void test_reload_rules(void **state)
{
	km_config cur, next;
	char err[256];
	const km_opt_table *t = km_config_table();

	km_config_init(&cur);
	assert_int_equal(km_config_set(&cur, "upstream", "k:9092", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_copy(&next, &cur), KM_OK);
	assert_int_equal(km_config_check_reload(&cur, &next, err, sizeof(err)), KM_OK);
	/* reloadable: accepted */
	assert_int_equal(km_config_set(&next, "idle_timeout_ms", "1", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&next, "advertised_host", "other", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_check_reload(&cur, &next, err, sizeof(err)), KM_OK);
	/* not reloadable: refused, naming the option */
	assert_int_equal(km_config_set(&next, "listen", "0.0.0.0:9093", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_check_reload(&cur, &next, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "listen"));
	km_config_free(&next);
	/* an invalid new config is refused as a whole */
	assert_int_equal(km_config_copy(&next, &cur), KM_OK);
	assert_int_equal(km_config_set(&next, "upstream", "", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_check_reload(&cur, &next, err, sizeof(err)), KM_ERR_CONFIG);
	km_config_free(&next);
	/* every non-reloadable option is caught by the equality check */
	for (size_t i = 0; i < t->count; i++)
		assert_true(km_opt_equal(&t->rows[i], &cur, &cur));
	km_config_free(&cur);
}

/* The SASL names of the table are the mechanisms src/net provides; anything else fails when set. */
static void test_sasl_mechanisms(void **state)
{
	const km_option *o = km_opt_find(km_config_table(), "upstream_sasl_mechanism");
	km_config cfg;
	char err[256];

	assert_non_null(o);
	assert_non_null(o->choices);
	for (size_t i = 0; i < o->choices->count; i++)
		assert_true(km_sasl_mechanism_supported(o->choices->names[i]));
	assert_false(km_sasl_mechanism_supported("XOAUTH2"));
	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_mechanism", "XOAUTH2", err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, GSSAPI, OAUTHBEARER"));
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_mechanism", "plain", err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_mechanism", "SCRAM-SHA-512", err, sizeof(err)), KM_OK);
	assert_string_equal(cfg.upstream_sasl_mechanism, "SCRAM-SHA-512");
	assert_int_equal(km_config_set(&cfg, "upstream", "k:9092", err, sizeof(err)), KM_OK);
	/* a mechanism needs a user name */
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_username", "u", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	/* Kerberos settings are GSSAPI's, and a keytab goes with a principal. */
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_kerberos_keytab", "/k.keytab", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "must be set together"));
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_kerberos_principal", "km@R", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "is for upstream_sasl_mechanism GSSAPI"));
	km_config_free(&cfg);

	/* GSSAPI: no user name or password; the service name defaults to kafka. */
	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "k:9092", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_mechanism", "GSSAPI", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	assert_string_equal(cfg.upstream_sasl_kerberos_service_name, "kafka");
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_kerberos_keytab", "/k.keytab", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_kerberos_principal", "km@R", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_password", "pw", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "GSSAPI takes no password"));
	km_config_free(&cfg);

	/* OAUTHBEARER: a file:// token endpoint, no user name or password; the URL is OAUTHBEARER's only. */
	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "k:9092", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_mechanism", "OAUTHBEARER", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "needs upstream_sasl_oauthbearer_token_endpoint_url file:///"));
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_oauthbearer_token_endpoint_url", "ldap://idp/token", err,
				       sizeof(err)),
			 KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "or http(s)://HOST/PATH"));
	/* A token endpoint: a client id and a secret (inline or in a file), a scope only with it. */
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_oauthbearer_token_endpoint_url", "https://idp/token", err,
				       sizeof(err)),
			 KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "goes with upstream_sasl_oauthbearer_client_id and _client_secret"));
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_oauthbearer_client_id", "kmirrord", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_oauthbearer_client_secret_file", "/s", err, sizeof(err)),
			 KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_oauthbearer_scope", "kafka", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_oauthbearer_client_secret", "s", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "set one of them, not both"));
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_oauthbearer_client_secret_file", "", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	/* A file: no client, no scope. */
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_oauthbearer_token_endpoint_url", "file:///run/km/token", err,
				       sizeof(err)),
			 KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_oauthbearer_client_id", "", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_oauthbearer_client_secret", "", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_oauthbearer_scope", "", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_username", "u", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "OAUTHBEARER takes no user name or password"));
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_mechanism", "PLAIN", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "upstream_sasl_oauthbearer_token_endpoint_url is for upstream_sasl_mechanism "
				    "OAUTHBEARER"));
	km_config_free(&cfg);
}

/* The value validate gives cfg with name = value set first (KM_OK, or the error containing want). */
static void validate_with(km_config *cfg, const char *name, const char *value, const char *want)
{
	char err[512] = "";

	assert_int_equal(km_config_set(cfg, name, value, err, sizeof(err)), KM_OK);
	if (!want) {
		if (km_config_validate(cfg, err, sizeof(err)) != KM_OK)
			fail_msg("unexpected error: %s", err);
		return;
	}
	assert_int_equal(km_config_validate(cfg, err, sizeof(err)), KM_ERR_CONFIG);
	if (!strstr(err, want))
		fail_msg("error '%s' does not contain '%s'", err, want);
}

/* PKCS12 stores instead of PEM files: each side takes one or the other, a password only with its store. */
static void test_tls_stores(void **state)
{
	km_config cfg;
	char err[256];
	(void)state;

	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "k:9092", err, sizeof(err)), KM_OK);
	validate_with(&cfg, "tls_keystore_password", "pw", "tls_keystore_password is the password of tls_keystore_file");
	validate_with(&cfg, "tls_keystore_file", "/l.p12", NULL);
	validate_with(&cfg, "tls_client_auth", "required", "tls_client_auth needs the listener's certificate");
	validate_with(&cfg, "tls_truststore_file", "/ca.p12", NULL);
	validate_with(&cfg, "tls_ca_file", "/ca.pem", "tls_ca_file and tls_truststore_file say the same thing");
	km_config_free(&cfg);

	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "k:9092", err, sizeof(err)), KM_OK);
	validate_with(&cfg, "upstream_tls_keystore_file", "/km.p12", "upstream_tls_* files are set but upstream_tls is false");
	validate_with(&cfg, "upstream_tls", "true", NULL);
	validate_with(&cfg, "upstream_tls_truststore_password", "pw", "upstream_tls_truststore_file, which is not set");
	validate_with(&cfg, "upstream_tls_truststore_file", "/ca.p12", NULL);
	validate_with(&cfg, "upstream_tls_cert_file", "/km.pem", "upstream_tls_cert_file and upstream_tls_keystore_file");
	km_config_free(&cfg);
}

/* docs/configuration.md embeds the generated table verbatim between markers. */
static void test_docs_match_table(void **state)
{
	char *gen;
	size_t glen;
	FILE *f = open_memstream(&gen, &glen);
	km_opt_write_doc(km_config_table(), f);
	fclose(f);
	assert_doc_shows("configuration.md", "<!-- BEGIN OPTIONS -->\n", "<!-- END OPTIONS -->", gen, glen,
			 "regenerate the table with kmirrord --config-doc");
	free(gen);
}

/* The upstream swap's file: written atomically, read back over the upstream option; bad content is an error. */
static void test_upstream_file(void **state)
{
	km_config cfg;
	char err[512], path[] = "/tmp/km-unit-upXXXXXX";
	int fd = mkstemp(path);
	char *bad = write_tmp("upstream = k:1\nlisten = 127.0.0.1:1\n");
	char *noline = write_tmp("# nothing\n");
	km_hostport list[2];

	assert_true(fd >= 0);
	close(fd);
	unlink(path); /* missing: no swap yet, the option stands */
	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "a:1", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_file", path, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_apply_upstream_file(&cfg, err, sizeof(err)), KM_OK);
	assert_int_equal(cfg.upstream_count, 1);
	assert_string_equal(cfg.upstream[0].host, "a");
	assert_true(km_hostport_parse("b.example:9092", &list[0]) && km_hostport_parse("c:9093", &list[1]));
	assert_int_equal(km_config_write_upstream_file(path, list, 2, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_apply_upstream_file(&cfg, err, sizeof(err)), KM_OK);
	assert_int_equal(cfg.upstream_count, 2);
	assert_string_equal(cfg.upstream[0].host, "b.example");
	assert_int_equal(cfg.upstream[1].port, 9093);
	assert_int_equal(access(path, F_OK), 0);
	unlink(path);
	assert_int_equal(km_config_set(&cfg, "upstream_file", bad, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_apply_upstream_file(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "listen"));
	assert_int_equal(km_config_set(&cfg, "upstream_file", noline, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_apply_upstream_file(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "no 'upstream"));
	assert_int_equal(km_config_write_upstream_file("/nonexistent/dir/up", list, 1, err, sizeof(err)), KM_ERR_IO);
	assert_non_null(strstr(err, "/nonexistent/dir/up.tmp"));
	km_config_free(&cfg);
	unlink(bad);
	unlink(noline);
	free(bad);
	free(noline);
}

/* The token file of upstream_sasl_oauthbearer_token_endpoint_url is a secret file: its mode is checked. */
static void test_token_file_mode(void **state)
{
	char *tok = write_tmp("a.b.c\n"), err[512], url[300];
	km_config cfg;
	(void)state;

	snprintf(url, sizeof(url), "file://%s", tok);
	assert_int_equal(chmod(tok, 0644), 0);
	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "k:9092", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_mechanism", "OAUTHBEARER", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_oauthbearer_token_endpoint_url", url, err, sizeof(err)),
			 KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_read_secrets(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "upstream_sasl_oauthbearer_token_endpoint_url"));
	assert_non_null(strstr(err, "chmod 600"));
	assert_int_equal(chmod(tok, 0600), 0);
	assert_int_equal(km_config_read_secrets(&cfg, err, sizeof(err)), KM_OK);
	km_config_free(&cfg);
	unlink(tok);
	free(tok);
}

/* upstream_sasl_password_file: read after validation, newline trimmed, mode checked, exclusive with the inline form. */
static void test_password_file(void **state)
{
	char *pw = write_tmp("s3cret pass\r\n"), *empty = write_tmp("\n"), err[512], want[300];
	km_config cfg, copy;
	(void)state;

	assert_int_equal(chmod(pw, 0600), 0);
	assert_int_equal(chmod(empty, 0600), 0);
	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "k:9092", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_password_file", pw, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_read_secrets(&cfg, err, sizeof(err)), KM_OK);
	assert_string_equal(cfg.upstream_sasl_password, "s3cret pass");
	/* read, it stays valid (a reload validates the new config again), copies and reloads */
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_copy(&copy, &cfg), KM_OK);
	assert_int_equal(km_config_check_reload(&cfg, &copy, err, sizeof(err)), KM_OK);
	assert_string_equal(copy.upstream_sasl_password, "s3cret pass");
	km_config_free(&copy);
	km_config_free(&cfg);

	/* both forms: refused */
	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "k:9092", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_password_file", pw, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_password", "inline", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_validate(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "upstream_sasl_password and upstream_sasl_password_file"));
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_password", "", err, sizeof(err)), KM_OK);

	/* group or others may read it: refused with what to run, unless the check is off */
	assert_int_equal(chmod(pw, 0640), 0);
	assert_int_equal(km_config_read_secrets(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	snprintf(want, sizeof(want), "upstream_sasl_password_file %s can be read or changed by group or others "
		 "(mode 0640): run chmod 600 %s", pw, pw);
	assert_non_null(strstr(err, want));
	assert_null(cfg.upstream_sasl_password);
	assert_int_equal(km_config_set(&cfg, "secret_file_mode_check", "false", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_read_secrets(&cfg, err, sizeof(err)), KM_OK);
	assert_string_equal(cfg.upstream_sasl_password, "s3cret pass");
	km_config_free(&cfg);

	/* empty, missing */
	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_password_file", empty, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_read_secrets(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "is empty"));
	unlink(pw);
	assert_int_equal(km_config_set(&cfg, "upstream_sasl_password_file", pw, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_read_secrets(&cfg, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "No such file"));
	km_config_free(&cfg);
	unlink(empty);
	free(pw);
	free(empty);
}

/* A listener's ":PORT" is every IPv4 address; an upstream needs its host. */
static void test_listen_any_host(void **state)
{
	static const char *const listeners[] = {"listen", "http_listen", "admin_listen"};
	km_config cfg;
	char err[512];

	km_config_init(&cfg);
	for (size_t i = 0; i < sizeof(listeners) / sizeof(listeners[0]); i++) {
		const km_option *o = km_opt_find(km_config_table(), listeners[i]);
		char v[64];
		assert_int_equal(km_config_set(&cfg, listeners[i], ":9644", err, sizeof(err)), KM_OK);
		km_opt_format(o, &cfg, v, sizeof(v));
		assert_string_equal(v, "0.0.0.0:9644");
		assert_int_equal(km_config_set(&cfg, listeners[i], ":", err, sizeof(err)), KM_ERR_CONFIG);
		assert_int_equal(km_config_set(&cfg, listeners[i], ":99999", err, sizeof(err)), KM_ERR_CONFIG);
		assert_non_null(strstr(err, "':99999' is not host:port"));
		assert_int_equal(km_config_set(&cfg, listeners[i], ":96x", err, sizeof(err)), KM_ERR_CONFIG);
	}
	assert_int_equal(km_config_set(&cfg, "upstream", ":9092", err, sizeof(err)), KM_ERR_CONFIG);
	km_config_free(&cfg);
}

/* --check-config's file check: every option naming a file or a directory, by name, path and errno text. */
static void test_check_files(void **state)
{
	const km_opt_table *t = km_config_table();
	char dir[] = "/tmp/km-unit-files-XXXXXX", out[8192], err[512], path[512], want[700];
	km_config cfg;
	size_t named = 0;
	char *file = write_tmp("x\n");

	/* Every option whose name ends in _file or _dir is checked: a missing path is reported for each. */
	km_config_init(&cfg);
	assert_int_equal(km_config_check_files(&cfg, out, sizeof(out)), 0);
	assert_string_equal(out, "");
	for (size_t i = 0; i < t->count; i++) {
		const char *name = t->rows[i].name;
		size_t len = strlen(name);
		if (len < 5 || (strcmp(name + len - 5, "_file") && strcmp(name + len - 4, "_dir")))
			continue;
		snprintf(path, sizeof(path), "/nonexistent-km/%s", name);
		assert_int_equal(km_config_set(&cfg, name, path, err, sizeof(err)), KM_OK);
		named++;
	}
	assert_int_equal(named, 18);
	assert_int_equal(km_config_check_files(&cfg, out, sizeof(out)), (int)named);
	for (size_t i = 0; i < t->count; i++) {
		const char *name = t->rows[i].name;
		size_t len = strlen(name);
		if (len < 5 || (strcmp(name + len - 5, "_file") && strcmp(name + len - 4, "_dir")))
			continue;
		if (!strcmp(name, "upstream_file"))
			snprintf(want, sizeof(want), "upstream_file /nonexistent-km/upstream_file: its directory "
				 "/nonexistent-km: No such file or directory");
		else
			snprintf(want, sizeof(want), "%s /nonexistent-km/%s: No such file or directory", name, name);
		if (!strstr(out, want))
			fail_msg("no '%s' in:\n%s", want, out);
	}
	km_config_free(&cfg);

	/* Files that are there pass; upstream_file may be absent when its directory is writable. */
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/upstream", dir);
	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "tls_cert_file", file, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "admin_token_file", file, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "mirror_file_dir", dir, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "upstream_file", path, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_check_files(&cfg, out, sizeof(out)), 0);

	/* A directory for a file, a file for a directory. */
	assert_int_equal(km_config_set(&cfg, "tls_key_file", dir, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "mirror_file_dir", file, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_check_files(&cfg, out, sizeof(out)), 2);
	snprintf(want, sizeof(want), "tls_key_file %s: is a directory, not a file", dir);
	assert_non_null(strstr(out, want));
	snprintf(want, sizeof(want), "mirror_file_dir %s: Not a directory", file);
	assert_non_null(strstr(out, want));

	/* Unreadable (root reads anything: then only the mode is set). */
	assert_int_equal(chmod(file, 0), 0);
	assert_int_equal(km_config_set(&cfg, "tls_key_file", file, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "mirror_file_dir", dir, err, sizeof(err)), KM_OK);
	if (geteuid() != 0) {
		assert_int_equal(km_config_check_files(&cfg, out, sizeof(out)), 3);
		snprintf(want, sizeof(want), "admin_token_file %s: Permission denied", file);
		assert_non_null(strstr(out, want));
	}
	km_config_free(&cfg);
	unlink(file);
	free(file);
	rmdir(dir);
}

/* A loopback advertised_host is a warning only when listen takes connections from elsewhere. */
static void test_loopback_warning(void **state)
{
	static const struct {
		const char *listen, *advertised;
		bool warn;
	} cases[] = {
		{"0.0.0.0:9092", "localhost", true},     {":9092", "127.0.0.1", true},
		{"10.1.2.3:9092", "127.9.9.9", true},    {"[::]:9092", "::1", true},
		{"0.0.0.0:9092", "LocalHost", true},     {"0.0.0.0:9092", "ip.localhost", true},
		{"0.0.0.0:9092", "::ffff:127.0.0.1", true},
		{"127.0.0.1:9092", "localhost", false},  {"127.0.3.2:9092", "127.0.3.2", false},
		{"[::1]:9092", "localhost", false},      {"localhost:9092", "127.0.0.1", false},
		{"0.0.0.0:9092", "proxy.example.com", false}, {"0.0.0.0:9092", "10.0.0.1", false},
		{"0.0.0.0:9092", "128.0.0.1", false},    {"0.0.0.0:9092", "notlocalhost", false},
	};
	char err[512], msg[1024];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		km_config cfg;
		km_config_init(&cfg);
		assert_int_equal(km_config_set(&cfg, "listen", cases[i].listen, err, sizeof(err)), KM_OK);
		assert_int_equal(km_config_set(&cfg, "advertised_host", cases[i].advertised, err, sizeof(err)), KM_OK);
		if (km_config_loopback_warning(&cfg, msg, sizeof(msg)) != cases[i].warn)
			fail_msg("listen %s, advertised_host %s: warning %s expected", cases[i].listen,
				 cases[i].advertised, cases[i].warn ? "" : "not");
		if (cases[i].warn) {
			assert_non_null(strstr(msg, cases[i].advertised));
			assert_non_null(strstr(msg, "loopback"));
		}
		km_config_free(&cfg);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults_round_trip), cmocka_unit_test(test_set_values),
		cmocka_unit_test(test_load_file),           cmocka_unit_test(test_validate),
		cmocka_unit_test(test_validate_admin_listen), cmocka_unit_test(test_hostport_options),
		cmocka_unit_test(test_print_config_long_values),
		cmocka_unit_test(test_reload_rules),        cmocka_unit_test(test_sasl_mechanisms),
		cmocka_unit_test(test_tls_stores),          cmocka_unit_test(test_docs_match_table),    cmocka_unit_test(test_upstream_file),
		cmocka_unit_test(test_password_file),
		cmocka_unit_test(test_token_file_mode),       cmocka_unit_test(test_listen_any_host),
		cmocka_unit_test(test_check_files),         cmocka_unit_test(test_loopback_warning),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
