/* kmirror CLI argument parsing: every command's required and exclusive options, values, and usage errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cli/cli.h"
#include "unit_tmpfile.h"

#define MAXARGS 32

/* Parse a NULL-terminated argument list (after the program name). */
static int parse(km_cli_args *a, char *err, const char *first, ...)
{
	char *argv[MAXARGS] = {"kmirror"};
	int argc = 1;
	va_list ap;

	va_start(ap, first);
	for (const char *s = first; s && argc < MAXARGS; s = va_arg(ap, const char *))
		argv[argc++] = (char *)s;
	va_end(ap);
	return km_cli_parse(argc, argv, a, err, 512);
}

/* The parse fails with exit 2 and err contains want. */
#define ASSERT_USAGE(want, ...)                                                        \
	do {                                                                           \
		km_cli_args a_;                                                        \
		char e_[512];                                                          \
		assert_int_equal(parse(&a_, e_, __VA_ARGS__, NULL), KM_CLI_EXIT_USAGE); \
		if (!strstr(e_, want))                                                 \
			fail_msg("error '%s' does not contain '%s'", e_, want);        \
		km_cli_args_free(&a_);                                                 \
	} while (0)

static void test_create(void **state)
{
	km_cli_args a;
	char err[512];
	(void)state;

	assert_int_equal(parse(&a, err, "--bootstrap-server", "127.0.0.2:9092", "--output=json", "create", "--mirror",
			       "m1", "--source-bootstrap", "src:9092", "--config", "sasl.password=a=b",
			       "--config", "mirror.x=1", "--config", "mirror.x=2", "--validate-only", "--timeout-ms",
			       "5000", NULL),
			 KM_CLI_EXIT_OK);
	assert_int_equal(a.cmd, KM_CLI_CMD_CREATE);
	assert_string_equal(a.bootstrap, "127.0.0.2:9092");
	assert_true(a.json);
	assert_true(a.validate_only);
	assert_int_equal(a.timeout_ms, 5000);
	assert_string_equal(a.mirror, "m1");
	/* The value keeps everything after the first '=', a later --config wins, and
	 * --source-bootstrap is the bootstrap.servers config. */
	assert_string_equal(km_cli_kvs_get(&a.configs, "sasl.password")->value, "a=b");
	assert_string_equal(km_cli_kvs_get(&a.configs, "mirror.x")->value, "2");
	assert_string_equal(km_cli_kvs_get(&a.configs, "bootstrap.servers")->value, "src:9092");
	assert_int_equal(a.configs.count, 3);
	km_cli_args_free(&a);

	ASSERT_USAGE("--source-bootstrap is required", "--bootstrap-server", "h:1", "create", "--mirror", "m");
	ASSERT_USAGE("--mirror is required", "--bootstrap-server", "h:1", "create", "--source-bootstrap", "s:1");
	ASSERT_USAGE("expected KEY=VALUE", "--bootstrap-server", "h:1", "create", "--mirror", "m",
		     "--source-bootstrap", "s:1", "--config", "novalue");
	ASSERT_USAGE("expected KEY=VALUE", "--bootstrap-server", "h:1", "create", "--mirror", "m",
		     "--source-bootstrap", "s:1", "--config", "=v");
	ASSERT_USAGE("disagree", "--bootstrap-server", "h:1", "create", "--mirror", "m", "--source-bootstrap", "s:1",
		     "--config", "bootstrap.servers=other:2");
	ASSERT_USAGE("--validate-only takes no value", "--bootstrap-server", "h:1", "create", "--mirror", "m",
		     "--source-bootstrap", "s:1", "--validate-only=yes");
}

static void test_config_file(void **state)
{
	char *path = write_tmp("# mirror configs\nsecurity.protocol=SASL_SSL\nmirror.x = from-file\n"
			       "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
			       "    username=\"u\" password=\"p\";\n");
	km_cli_args a;
	char err[512];
	(void)state;

	/* The file first, --config on top of it. */
	assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "create", "--mirror", "m", "--config", "mirror.x=cli",
			       "--config-file", path, "--source-bootstrap", "s:1", NULL),
			 KM_CLI_EXIT_OK);
	assert_string_equal(km_cli_kvs_get(&a.configs, "mirror.x")->value, "cli");
	assert_string_equal(km_cli_kvs_get(&a.configs, "security.protocol")->value, "SASL_SSL");
	assert_string_equal(km_cli_kvs_get(&a.configs, "sasl.jaas.config")->value,
			    "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=\"p\";");
	/* secrets in the file: nothing to warn about */
	assert_string_equal(a.inline_secret, "");
	km_cli_args_free(&a);
	/* alter takes the file too (--config wins); a key set in the file cannot also be deleted */
	assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "alter", "--mirror", "m", "--config-file", path,
			       "--config", "mirror.x=cli", "--delete-config", "mirror.y", NULL),
			 KM_CLI_EXIT_OK);
	assert_string_equal(km_cli_kvs_get(&a.configs, "mirror.x")->value, "cli");
	assert_non_null(km_cli_kvs_get(&a.configs, "sasl.jaas.config"));
	assert_null(km_cli_kvs_get(&a.configs, "mirror.y")->value);
	assert_string_equal(a.inline_secret, "");
	km_cli_args_free(&a);
	ASSERT_USAGE("alter: security.protocol is both set and deleted", "--bootstrap-server", "h:1", "alter",
		     "--mirror", "m", "--config-file", path, "--delete-config", "security.protocol");
	unlink(path);
	free(path);
	ASSERT_USAGE("cannot open", "--bootstrap-server", "h:1", "create", "--mirror", "m", "--source-bootstrap", "s:1",
		     "--config-file", "/nonexistent/x.properties");
}

/* A secret given as --config KEY=VALUE is named for the warning kmirror prints; other keys are not. */
static void test_inline_secret(void **state)
{
	static const char *const secrets[] = {"sasl.password", "sasl.jaas.config", "ssl.key.password",
					      "ssl.truststore.password", "foo.password"};
	km_cli_args a;
	char err[512], kv[64];
	(void)state;

	for (size_t i = 0; i < sizeof(secrets) / sizeof(secrets[0]); i++) {
		snprintf(kv, sizeof(kv), "%s=x", secrets[i]);
		assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "alter", "--mirror", "m", "--config",
				       "mirror.x=1", "--config", kv, NULL),
				 KM_CLI_EXIT_OK);
		assert_string_equal(a.inline_secret, secrets[i]);
		km_cli_args_free(&a);
	}
	assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "create", "--mirror", "m", "--source-bootstrap",
			       "s:1", "--config", "sasl.username=u", "--config", "password=x", NULL),
			 KM_CLI_EXIT_OK);
	assert_string_equal(a.inline_secret, "");
	km_cli_args_free(&a);
}

static void test_topic_commands(void **state)
{
	km_cli_args a;
	char err[512];
	(void)state;

	assert_int_equal(parse(&a, err, "pause", "--mirror", "m", "--topics", "a,b.c,d_e", "--bootstrap-server", "h:1",
			       NULL),
			 KM_CLI_EXIT_OK);
	assert_int_equal(a.cmd, KM_CLI_CMD_PAUSE);
	assert_int_equal(a.ntopics, 3);
	assert_string_equal(a.topics[0], "a");
	assert_string_equal(a.topics[1], "b.c");
	assert_string_equal(a.topics[2], "d_e");
	km_cli_args_free(&a);

	assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "start", "--mirror", "m", "--topics-regex",
			       "orders-.*", NULL),
			 KM_CLI_EXIT_OK);
	assert_string_equal(a.topics_regex, "orders-.*");
	assert_null(a.topics);
	km_cli_args_free(&a);

	/* --dry-run: stop only, a flag, and it still needs the topics stop would take. */
	assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "stop", "--mirror", "m", "--topics-regex", ".*",
			       "--dry-run", NULL),
			 KM_CLI_EXIT_OK);
	assert_true(a.dry_run);
	assert_int_equal(a.cmd, KM_CLI_CMD_STOP);
	km_cli_args_free(&a);
	assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "stop", "--mirror", "m", "--topics", "a", NULL),
			 KM_CLI_EXIT_OK);
	assert_false(a.dry_run);
	km_cli_args_free(&a);
	ASSERT_USAGE("pause does not take --dry-run", "--bootstrap-server", "h:1", "pause", "--mirror", "m",
		     "--topics", "a", "--dry-run");

	/* promote: stop at zero lag, waiting --wait-ms (default a minute); --dry-run as stop's. */
	assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "promote", "--mirror", "m", "--topics", "a", NULL),
			 KM_CLI_EXIT_OK);
	assert_int_equal(a.cmd, KM_CLI_CMD_PROMOTE);
	assert_int_equal(a.wait_ms, 60000);
	km_cli_args_free(&a);
	assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "promote", "--mirror", "m", "--topics-regex", ".*",
			       "--wait-ms", "0", "--dry-run", NULL),
			 KM_CLI_EXIT_OK);
	assert_int_equal(a.wait_ms, 0);
	assert_true(a.dry_run);
	km_cli_args_free(&a);
	ASSERT_USAGE("--wait-ms '-1'", "--bootstrap-server", "h:1", "promote", "--mirror", "m", "--topics", "a",
		     "--wait-ms", "-1");
	ASSERT_USAGE("stop does not take --wait-ms", "--bootstrap-server", "h:1", "stop", "--mirror", "m", "--topics",
		     "a", "--wait-ms", "5");
	ASSERT_USAGE("--topics or --topics-regex is required", "--bootstrap-server", "h:1", "promote", "--mirror", "m");

	/* reverse: both sides' steps; the peer's address and mirror are required. */
	assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "reverse", "--mirror", "m", "--topics", "a",
			       "--peer-bootstrap", "p:2", "--peer-mirror", "back", NULL),
			 KM_CLI_EXIT_OK);
	assert_int_equal(a.cmd, KM_CLI_CMD_REVERSE);
	assert_string_equal(a.peer_bootstrap, "p:2");
	assert_string_equal(a.peer_mirror, "back");
	km_cli_args_free(&a);
	ASSERT_USAGE("--peer-bootstrap and --peer-mirror are required", "--bootstrap-server", "h:1", "reverse",
		     "--mirror", "m", "--topics", "a", "--peer-bootstrap", "p:2");
	ASSERT_USAGE("reverse does not take --dry-run", "--bootstrap-server", "h:1", "reverse", "--mirror", "m",
		     "--topics", "a", "--peer-bootstrap", "p:2", "--peer-mirror", "b", "--dry-run");
	/* swap-upstream: the admin endpoint, not the Kafka listener (no --bootstrap-server needed). */
	assert_int_equal(parse(&a, err, "swap-upstream", "--admin", "h:8080", "--token-file", "/t", "--to", "b:9092,c:9092",
			       "--wait-ms", "1000", NULL),
			 KM_CLI_EXIT_OK);
	assert_int_equal(a.cmd, KM_CLI_CMD_SWAP_UPSTREAM);
	assert_string_equal(a.admin, "h:8080");
	assert_string_equal(a.token_file, "/t");
	assert_string_equal(a.to, "b:9092,c:9092");
	assert_int_equal(a.wait_ms, 1000);
	assert_null(a.admin_ca);
	km_cli_args_free(&a);
	/* --admin-ca: HTTPS to admin_listen */
	assert_int_equal(parse(&a, err, "swap-upstream", "--admin", "h:9645", "--admin-ca", "/ca.pem", "--token-file",
			       "/t", "--to", "b:9092", NULL),
			 KM_CLI_EXIT_OK);
	assert_string_equal(a.admin_ca, "/ca.pem");
	km_cli_args_free(&a);
	ASSERT_USAGE("stop does not take --admin-ca", "--bootstrap-server", "h:1", "stop", "--mirror", "m", "--topics",
		     "a", "--admin-ca", "/ca.pem");
	ASSERT_USAGE("--admin, --token-file and --to are required", "swap-upstream", "--admin", "h:1", "--to", "b:1");
	ASSERT_USAGE("--to: empty upstream", "swap-upstream", "--admin", "h:1", "--token-file", "/t", "--to", "");
	ASSERT_USAGE("swap-upstream does not take --mirror", "swap-upstream", "--admin", "h:1", "--token-file", "/t",
		     "--to", "b:1", "--mirror", "m");
	ASSERT_USAGE("stop does not take --to", "--bootstrap-server", "h:1", "stop", "--mirror", "m", "--topics", "a",
		     "--to", "b:1");
	ASSERT_USAGE("--dry-run takes no value", "--bootstrap-server", "h:1", "stop", "--mirror", "m", "--topics",
		     "a", "--dry-run=yes");
	ASSERT_USAGE("--topics or --topics-regex is required", "--bootstrap-server", "h:1", "stop", "--mirror", "m",
		     "--dry-run");
	ASSERT_USAGE("--topics or --topics-regex is required", "--bootstrap-server", "h:1", "stop", "--mirror", "m");
	ASSERT_USAGE("not both", "--bootstrap-server", "h:1", "resume", "--mirror", "m", "--topics", "a",
		     "--topics-regex", "a");
	ASSERT_USAGE("empty topic name", "--bootstrap-server", "h:1", "stop", "--mirror", "m", "--topics", "a,");
	ASSERT_USAGE("empty topic name", "--bootstrap-server", "h:1", "stop", "--mirror", "m", "--topics", ",a");
	ASSERT_USAGE("--topics given twice", "--bootstrap-server", "h:1", "stop", "--mirror", "m", "--topics", "a",
		     "--topics", "b");
	ASSERT_USAGE("--mirror is required", "--bootstrap-server", "h:1", "start", "--topics", "a");
	ASSERT_USAGE("--mirror given twice", "--bootstrap-server", "h:1", "start", "--mirror", "a", "--mirror", "b",
		     "--topics", "a");
}

static void test_other_commands(void **state)
{
	km_cli_args a;
	char err[512];
	(void)state;

	assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "describe", NULL), KM_CLI_EXIT_OK);
	assert_int_equal(a.cmd, KM_CLI_CMD_DESCRIBE);
	assert_null(a.mirror);
	assert_false(a.json);
	km_cli_args_free(&a);

	assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "alter", "--mirror", "m", "--config", "mirror.a=1",
			       "--delete-config", "mirror.b", NULL),
			 KM_CLI_EXIT_OK);
	assert_string_equal(km_cli_kvs_get(&a.configs, "mirror.a")->value, "1");
	assert_non_null(km_cli_kvs_get(&a.configs, "mirror.b"));
	assert_null(km_cli_kvs_get(&a.configs, "mirror.b")->value); /* deleted: sent as null */
	km_cli_args_free(&a);

	assert_int_equal(parse(&a, err, "--bootstrap-server", "h:1", "last-mirrored-offsets", "--mirror", "m", NULL),
			 KM_CLI_EXIT_OK);
	assert_int_equal(a.cmd, KM_CLI_CMD_LAST_OFFSETS);
	km_cli_args_free(&a);

	ASSERT_USAGE("nothing to change", "--bootstrap-server", "h:1", "alter", "--mirror", "m");
	ASSERT_USAGE("both set and deleted", "--bootstrap-server", "h:1", "alter", "--mirror", "m", "--config",
		     "mirror.a=1", "--delete-config", "mirror.a");
	ASSERT_USAGE("list does not take --mirror", "--bootstrap-server", "h:1", "list", "--mirror", "m");
	ASSERT_USAGE("delete does not take --topics", "--bootstrap-server", "h:1", "delete", "--mirror", "m",
		     "--topics", "a");
	ASSERT_USAGE("describe does not take --config", "--bootstrap-server", "h:1", "describe", "--config", "a=b");
}

static void test_global_errors(void **state)
{
	km_cli_args a;
	char err[512];
	(void)state;

	ASSERT_USAGE("no command given", "--bootstrap-server", "h:1");
	ASSERT_USAGE("unknown command 'frobnicate'", "--bootstrap-server", "h:1", "frobnicate");
	ASSERT_USAGE("unknown option '--bogus'", "--bootstrap-server", "h:1", "list", "--bogus");
	ASSERT_USAGE("--bootstrap-server is required", "list");
	ASSERT_USAGE("--bootstrap-server needs a value", "list", "--bootstrap-server");
	ASSERT_USAGE("--output 'yaml'", "--bootstrap-server", "h:1", "--output", "yaml", "list");
	ASSERT_USAGE("--timeout-ms '0'", "--bootstrap-server", "h:1", "--timeout-ms", "0", "list");
	ASSERT_USAGE("--timeout-ms '12x'", "--bootstrap-server", "h:1", "--timeout-ms", "12x", "list");
	ASSERT_USAGE("unexpected argument 'extra'", "--bootstrap-server", "h:1", "list", "extra");
	ASSERT_USAGE("--mirror comes after the command", "--mirror", "m", "list");

	/* --help and --version win over everything missing, and keep the command for its usage. */
	assert_int_equal(parse(&a, err, "start", "--help", NULL), KM_CLI_EXIT_OK);
	assert_true(a.help);
	assert_int_equal(a.cmd, KM_CLI_CMD_START);
	km_cli_args_free(&a);
	assert_int_equal(parse(&a, err, "--version", NULL), KM_CLI_EXIT_OK);
	assert_true(a.version);
	km_cli_args_free(&a);
}

static void test_usage_text(void **state)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	(void)state;

	km_cli_usage(f, KM_CLI_CMD_NONE);
	km_cli_usage(f, KM_CLI_CMD_LAST_OFFSETS);
	fclose(f);
	/* Every command is in the general usage. */
	for (int c = KM_CLI_CMD_CREATE; c <= KM_CLI_CMD_LAST_OFFSETS; c++)
		assert_non_null(strstr(buf, km_cli_cmd_name((km_cli_cmd)c)));
	assert_non_null(strstr(buf, "usage: kmirror --bootstrap-server HOST:PORT [global options] last-mirrored-offsets"));
	/* Every exit status is named, promote's 3 too. */
	assert_non_null(strstr(buf, "2 bad usage,\n3 promote's wait ran out"));
	free(buf);
}

/* Kafka habits: --topic, kmirror help [COMMAND], a suggestion for a mistyped option, the bootstrap from the environment. */
static void test_kafka_habits(void **state)
{
	km_cli_args a;
	char err[512];
	char *buf = NULL;
	size_t len = 0;
	FILE *f;
	(void)state;

	assert_int_equal(parse(&a, err, "--bootstrap-server", "k:9092", "stop", "--mirror", "m", "--topic", "orders", NULL),
			 KM_CLI_EXIT_OK);
	assert_int_equal(a.ntopics, 1);
	assert_string_equal(a.topics[0], "orders");
	km_cli_args_free(&a);

	assert_int_equal(parse(&a, err, "help", "start", NULL), KM_CLI_EXIT_OK);
	assert_true(a.help);
	assert_int_equal(a.cmd, KM_CLI_CMD_START);
	km_cli_args_free(&a);
	assert_int_equal(parse(&a, err, "help", NULL), KM_CLI_EXIT_OK);
	assert_true(a.help);
	assert_int_equal(a.cmd, KM_CLI_CMD_NONE);
	km_cli_args_free(&a);
	ASSERT_USAGE("help: unknown command 'strat'", "help", "strat");

	ASSERT_USAGE("unknown option '--topcs' (did you mean --topics?", "--bootstrap-server", "k:9092", "start", "--mirror",
		     "m", "--topcs", "a");
	ASSERT_USAGE("unknown option '--miror' (did you mean --mirror?", "--bootstrap-server", "k:9092", "start",
		     "--miror=m");
	ASSERT_USAGE("unknown option '--frobnicate' (try --help)", "--frobnicate");

	setenv("KMIRROR_BOOTSTRAP_SERVER", "env-host:9092", 1);
	assert_int_equal(parse(&a, err, "list", NULL), KM_CLI_EXIT_OK);
	assert_string_equal(a.bootstrap, "env-host:9092");
	km_cli_args_free(&a);
	assert_int_equal(parse(&a, err, "--bootstrap-server", "flag:9092", "list", NULL), KM_CLI_EXIT_OK);
	assert_string_equal(a.bootstrap, "flag:9092"); /* the flag wins */
	km_cli_args_free(&a);
	unsetenv("KMIRROR_BOOTSTRAP_SERVER");
	ASSERT_USAGE("or set KMIRROR_BOOTSTRAP_SERVER", "list");

	/* swap-upstream goes to the admin listener: its usage names no --bootstrap-server. */
	f = open_memstream(&buf, &len);
	km_cli_usage(f, KM_CLI_CMD_SWAP_UPSTREAM);
	fclose(f);
	assert_null(strstr(buf, "--bootstrap-server"));
	assert_non_null(strstr(buf, "usage: kmirror [--output table|json] [--timeout-ms N] swap-upstream --admin"));
	free(buf);
}

static void test_hostport(void **state)
{
	char host[64];
	uint16_t port;
	(void)state;

	assert_true(km_cli_split_hostport("127.0.0.2:9092", host, sizeof(host), &port));
	assert_string_equal(host, "127.0.0.2");
	assert_int_equal(port, 9092);
	assert_true(km_cli_split_hostport("[::1]:19092", host, sizeof(host), &port));
	assert_string_equal(host, "::1");
	assert_int_equal(port, 19092);
	assert_false(km_cli_split_hostport("::1:9092", host, sizeof(host), &port));
	assert_false(km_cli_split_hostport("host", host, sizeof(host), &port));
	assert_false(km_cli_split_hostport("host:0", host, sizeof(host), &port));
	assert_false(km_cli_split_hostport("host:70000", host, sizeof(host), &port));
	assert_false(km_cli_split_hostport(":9092", host, sizeof(host), &port));
	assert_false(km_cli_split_hostport("host:9x", host, sizeof(host), &port));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create),         cmocka_unit_test(test_config_file), cmocka_unit_test(test_inline_secret),
		cmocka_unit_test(test_topic_commands), cmocka_unit_test(test_other_commands),
		cmocka_unit_test(test_global_errors),  cmocka_unit_test(test_usage_text),
		cmocka_unit_test(test_hostport),      cmocka_unit_test(test_kafka_habits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
