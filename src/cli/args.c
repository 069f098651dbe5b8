/* kmirror CLI argument parsing: global options, the command, its options, and each command's usage text. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "cli/cli.h"
#include "kmirror/secret.h"

#define DEFAULT_TIMEOUT_MS 30000
#define MAX_TIMEOUT_MS (24LL * 3600 * 1000)

/* Which options a command takes. */
enum {
	O_MIRROR = 1 << 0,
	O_SOURCE = 1 << 1,
	O_CONFIG = 1 << 2,
	O_CONFIG_FILE = 1 << 3,
	O_VALIDATE = 1 << 4,
	O_DELETE_CONFIG = 1 << 5,
	O_TOPICS = 1 << 6,
	O_TOPICS_REGEX = 1 << 7,
	O_DRY_RUN = 1 << 8,
	O_WAIT = 1 << 9,
	O_PEER = 1 << 10,
	O_SWAP = 1 << 11,
	O_ADOPT = 1 << 12,
};

typedef struct cmd_info {
	km_cli_cmd cmd;
	const char *name;
	unsigned opts;
	const char *synopsis;
	const char *about;
} cmd_info;

static const cmd_info cmds[] = {
	{KM_CLI_CMD_CREATE, "create", O_MIRROR | O_SOURCE | O_CONFIG | O_CONFIG_FILE | O_VALIDATE,
	 "create --mirror NAME --source-bootstrap HOST:PORT [--config KEY=VALUE]... [--config-file FILE] "
	 "[--validate-only]",
	 "Create a mirror of the source cluster at HOST:PORT. --config sets source connection properties\n"
	 "(security.protocol, sasl.*, ssl.*) and mirror.* options; --config-file reads them from a properties\n"
	 "file (--config wins). Give secrets (sasl.password, sasl.jaas.config, *.password) in the file: on\n"
	 "the command line every user of the host sees them. --validate-only checks everything and creates\n"
	 "nothing."},
	{KM_CLI_CMD_LIST, "list", 0, "list", "List every mirror (name, source bootstrap servers, topic count), then every kmirrord as it last reported itself (state delay, what it runs)."},
	{KM_CLI_CMD_DESCRIBE, "describe", O_MIRROR | O_TOPICS, "describe [--mirror NAME] [--topics A,B]",
	 "Describe a mirror (or all): its configuration, secrets shown as (secret), its metadata sync per\n"
	 "step (last sync, compared, changes, skipped groups, errors), and every partition of its topics:\n"
	 "state, since when, source log end, mirrored offset, lag and last error."},
	{KM_CLI_CMD_ALTER, "alter", O_MIRROR | O_CONFIG | O_CONFIG_FILE | O_DELETE_CONFIG,
	 "alter --mirror NAME [--config KEY=VALUE]... [--config-file FILE] [--delete-config KEY]...",
	 "Change a mirror's options at run time: --config sets a key, --config-file sets those of a\n"
	 "properties file (--config wins), --delete-config removes a key. Give secrets (sasl.password,\n"
	 "sasl.jaas.config, *.password) in the file: on the command line every user of the host sees them."},
	{KM_CLI_CMD_DELETE, "delete", O_MIRROR, "delete --mirror NAME",
	 "Delete a mirror. Refused while any of its topics is not STOPPED."},
	{KM_CLI_CMD_START, "start", O_MIRROR | O_TOPICS | O_TOPICS_REGEX | O_DRY_RUN | O_ADOPT,
	 "start --mirror NAME (--topics A,B | --topics-regex RE) [--adopt-existing] [--dry-run]",
	 "Start mirroring topics (not mirrored, STOPPED or FAILED). --topics-regex matches whole names\n"
	 "of the source's topics (a start creates them here; the source is asked with --command-config's\n"
	 "settings) and of the destination's (POSIX extended regex). A start from the kmirrord a topic\n"
	 "was mirrored into is a failback: it keeps what is here below where that mirror stopped, hides\n"
	 "the rest and mirrors only the delta. A start of a topic STOPPED here goes back to where the\n"
	 "stop left it and hides what was written here since (a drill). --dry-run starts nothing: it\n"
	 "prints, per partition, how the start goes (after the stop, failback, from scratch; the source\n"
	 "is asked with --command-config's settings), where it stopped, the end here and the records\n"
	 "it would hide. A topic here that holds records no mirror here wrote, and is no failback, is\n"
	 "refused (TOPIC_ALREADY_EXISTS): --adopt-existing starts it all the same and hides them."},
	{KM_CLI_CMD_STOP, "stop", O_MIRROR | O_TOPICS | O_TOPICS_REGEX | O_DRY_RUN,
	 "stop --mirror NAME (--topics A,B | --topics-regex RE) [--dry-run]",
	 "Stop mirroring topics (PREPARING, MIRRORING, PAUSED or FAILED); they become writable.\n"
	 "--topics-regex matches whole names of the mirror's topics.\n"
	 "--dry-run stops nothing: it prints, per partition, the state, the mirrored offset, the source's\n"
	 "end offset, the records in open transactions (mirrored inside transactions the source has not\n"
	 "decided as far as mirrored: a stop aborts them) and the records at risk (source end - mirrored\n"
	 "+ in open transactions; ? when unknown), and their total. The source's partition leaders are\n"
	 "asked their end offsets (with --command-config's settings, 5 s at most); when the source cannot\n"
	 "be reached the dry run says so and uses kmirrord's last fetched figure, with its age."},
	{KM_CLI_CMD_PROMOTE, "promote", O_MIRROR | O_TOPICS | O_TOPICS_REGEX | O_DRY_RUN | O_WAIT,
	 "promote --mirror NAME (--topics A,B | --topics-regex RE) [--wait-ms N] [--dry-run]",
	 "A planned failover: stop the topics once nothing is left to mirror, every partition's lag\n"
	 "zero and no transaction open in it, as kmirrord last fetched the source. Waits up to --wait-ms\n"
	 "(default 60000), printing what is still behind; then stops them as stop does. If they are still\n"
	 "behind then, nothing is stopped and the partitions behind are named (exit 3; a refusal exits 1);\n"
	 "stop fails over at once. Quiesce the source's producers first. --dry-run prints what stop\n"
	 "--dry-run prints."},
	{KM_CLI_CMD_REVERSE, "reverse", O_MIRROR | O_TOPICS | O_TOPICS_REGEX | O_WAIT | O_PEER,
	 "reverse --mirror NAME (--topics A,B | --topics-regex RE) --peer-bootstrap HOST:PORT\n"
	 "        --peer-mirror NAME2 [--wait-ms N]",
	 "Reverse the direction of a mirror, both sides' steps as one operation: promote the topics\n"
	 "here (--wait-ms as for promote; topics already STOPPED are taken as they are), wait until they\n"
	 "are STOPPED, then on the kmirrord in front of the mirror's source (--peer-bootstrap, reached\n"
	 "with the same --command-config) create mirror NAME2 from this kmirrord (unless it exists) and\n"
	 "start it on the same topics: a failback start there mirrors only what this side took since\n"
	 "(its divergent tail hidden). The mirror it creates reaches this kmirrord at --bootstrap-server\n"
	 "with no security settings: create it by hand first when it needs them. Each step prints as its\n"
	 "own command does (--output json: one document per step); a refusal ends the operation there,\n"
	 "with the steps done named."},
	{KM_CLI_CMD_SWAP_UPSTREAM, "swap-upstream", O_SWAP | O_WAIT,
	 "swap-upstream --admin HOST:PORT [--admin-ca FILE] --token-file FILE --to HOST:PORT[,HOST:PORT...] "
	 "[--wait-ms N]",
	 "Make kmirrord front another cluster (docs/proxy.md, \"Upstream swap\"), through its HTTP admin\n"
	 "endpoint (--admin: its admin_listen, or its http_listen when that is unset; --admin-ca: the CA\n"
	 "bundle that verifies the certificate of an admin_listen speaking HTTPS, which then is used;\n"
	 "--token-file: a file holding the token of its admin_token_file). kmirrord reads the new\n"
	 "cluster's mirror state,\n"
	 "writes the new upstream to its upstream_file, then serves new connections from the new cluster\n"
	 "and moves the open ones over gradually. Prints the progress until the open connections moved\n"
	 "(at most --wait-ms, default 60000; the swap goes on after that); exit 1 when it is refused or\n"
	 "fails (kmirrord then still fronts the previous cluster)."},
	{KM_CLI_CMD_PAUSE, "pause", O_MIRROR | O_TOPICS | O_TOPICS_REGEX,
	 "pause --mirror NAME (--topics A,B | --topics-regex RE)",
	 "Pause mirroring topics (MIRRORING); they stay read-only. --topics-regex matches whole names\n"
	 "of the mirror's topics."},
	{KM_CLI_CMD_RESUME, "resume", O_MIRROR | O_TOPICS | O_TOPICS_REGEX,
	 "resume --mirror NAME (--topics A,B | --topics-regex RE)",
	 "Resume mirroring topics (PAUSED). --topics-regex matches whole names of the mirror's topics."},
	{KM_CLI_CMD_LAST_OFFSETS, "last-mirrored-offsets", O_MIRROR | O_TOPICS,
	 "last-mirrored-offsets --mirror NAME [--topics A,B]",
	 "The last mirrored offset and source leader epoch of every partition (for failover)."},
};

static const cmd_info *cmd_lookup(km_cli_cmd cmd)
{
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (cmds[i].cmd == cmd)
			return &cmds[i];
	return NULL;
}

const char *km_cli_cmd_name(km_cli_cmd cmd)
{
	const cmd_info *ci = cmd_lookup(cmd);
	return ci ? ci->name : NULL;
}

static const char global_usage[] =
	"usage: kmirror --bootstrap-server HOST:PORT [--command-config FILE] [--output table|json]\n"
	"               [--timeout-ms N] COMMAND [OPTIONS]\n"
	"       kmirror --version | --help | help [COMMAND] | COMMAND --help\n"
	"\n"
	"Create, describe and control mirrors through kmirrord (point --bootstrap-server at kmirrord).\n"
	"\n"
	"Global options:\n"
	"  --bootstrap-server HOST:PORT  kmirrord's client listener (a comma list: the first that answers);\n"
	"                                KMIRROR_BOOTSTRAP_SERVER when not given\n"
	"  --command-config FILE         client properties as Kafka's tools take them: security.protocol,\n"
	"                                sasl.mechanism, sasl.jaas.config, sasl.username, sasl.password,\n"
	"                                sasl.kerberos.service.name (GSSAPI: a Krb5LoginModule line with a\n"
	"                                keytab), sasl.oauthbearer.token.endpoint.url (OAUTHBEARER:\n"
	"                                file:///PATH, a file holding the token), ssl.ca.location,\n"
	"                                ssl.certificate.location, ssl.key.location,\n"
	"                                ssl.endpoint.identification.algorithm\n"
	"  --output table|json           human tables (default) or one JSON document on stdout\n"
	"  --timeout-ms N                connect and request timeout (default 30000)\n"
	"\n"
	"Exit status: 0 success, 1 an error from kmirrord (or it could not be reached), 2 bad usage,\n"
	"3 promote's wait ran out (nothing was stopped; a refusal is 1).\n"
	"\n"
	"Commands:\n";

void km_cli_usage(FILE *out, km_cli_cmd cmd)
{
	const cmd_info *ci = cmd_lookup(cmd);

	if (!ci) {
		fputs(global_usage, out);
		for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
			fprintf(out, "  %s\n", cmds[i].synopsis);
		fputs("\nSee kmirror COMMAND --help, and man kmirror.\n", out);
		return;
	}
	/* swap-upstream talks to kmirrord's admin listener (--admin), not to its client listener. */
	fprintf(out, "usage: kmirror %s%s\n\n%s\n",
		ci->cmd == KM_CLI_CMD_SWAP_UPSTREAM ? "[--output table|json] [--timeout-ms N] " :
						      "--bootstrap-server HOST:PORT [global options] ",
		ci->synopsis, ci->about);
}

/* ---- km_cli_kvs ---- */

bool km_cli_kvs_set(km_cli_kvs *kv, const char *name, const char *value)
{
	char *n, *v = NULL;

	for (size_t i = 0; i < kv->count; i++) {
		if (strcmp(kv->items[i].name, name) != 0)
			continue;
		if (value && !(v = strdup(value)))
			return false;
		free(kv->items[i].value);
		kv->items[i].value = v;
		return true;
	}
	if (kv->count == kv->cap) {
		size_t cap = kv->cap ? kv->cap * 2 : 8;
		km_cli_kv *items = realloc(kv->items, cap * sizeof(*items));
		if (!items)
			return false;
		kv->items = items;
		kv->cap = cap;
	}
	n = strdup(name);
	if (!n || (value && !(v = strdup(value)))) {
		free(n);
		return false;
	}
	kv->items[kv->count].name = n;
	kv->items[kv->count++].value = v;
	return true;
}

const km_cli_kv *km_cli_kvs_get(const km_cli_kvs *kv, const char *name)
{
	for (size_t i = 0; i < kv->count; i++)
		if (!strcmp(kv->items[i].name, name))
			return &kv->items[i];
	return NULL;
}

void km_cli_kvs_free(km_cli_kvs *kv)
{
	for (size_t i = 0; i < kv->count; i++) {
		char *v = kv->items[i].value;
		if (v && km_secret_config_key(kv->items[i].name))
			OPENSSL_cleanse(v, strlen(v));
		free(kv->items[i].name);
		free(v);
	}
	free(kv->items);
	memset(kv, 0, sizeof(*kv));
}

/* ---- parsing ---- */

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return KM_CLI_EXIT_USAGE;
}

/* Split a comma list of topic names; empty names are an error. */
static int parse_topics(const char *list, km_cli_args *a, char *err, size_t errlen)
{
	const char *p = list;

	if (a->topics)
		return fail(err, errlen, "--topics given twice");
	if (!*list)
		return fail(err, errlen, "--topics: empty list");
	a->topics = calloc(1, sizeof(char *));
	if (!a->topics)
		return fail(err, errlen, "out of memory");
	for (;;) {
		const char *comma = strchr(p, ',');
		size_t n = comma ? (size_t)(comma - p) : strlen(p);
		char **t;
		if (n == 0)
			return fail(err, errlen, "--topics '%s': empty topic name", list);
		if (n > 249)
			return fail(err, errlen, "--topics: topic name '%.40s...' longer than 249 characters", p);
		if (a->ntopics >= KM_CLI_MAX_TOPICS)
			return fail(err, errlen, "--topics: more than %d topics", KM_CLI_MAX_TOPICS);
		t = realloc(a->topics, (a->ntopics + 1) * sizeof(char *));
		if (!t)
			return fail(err, errlen, "out of memory");
		a->topics = t;
		if (!(a->topics[a->ntopics] = strndup(p, n)))
			return fail(err, errlen, "out of memory");
		a->ntopics++;
		if (!comma)
			return KM_CLI_EXIT_OK;
		p = comma + 1;
	}
}

/* --config KEY=VALUE into kv; the first secret key given so into a->inline_secret (main warns). */
static int parse_config(km_cli_args *a, const char *s, km_cli_kvs *kv, char *err, size_t errlen)
{
	const char *eq = strchr(s, '=');
	char *key;
	bool ok;

	if (!eq || eq == s)
		return fail(err, errlen, "--config '%s': expected KEY=VALUE", s);
	key = strndup(s, (size_t)(eq - s));
	if (!key)
		return fail(err, errlen, "out of memory");
	if (km_secret_config_key(key) && !a->inline_secret[0])
		snprintf(a->inline_secret, sizeof(a->inline_secret), "%s", key);
	ok = km_cli_kvs_set(kv, key, eq + 1);
	free(key);
	return ok ? KM_CLI_EXIT_OK : fail(err, errlen, "out of memory");
}

typedef struct opt_def {
	const char *name;
	unsigned bit;     /* 0: a global option */
	bool has_value;
} opt_def;

static const opt_def opt_defs[] = {
	{"--bootstrap-server", 0, true},  {"--command-config", 0, true}, {"--output", 0, true},
	{"--timeout-ms", 0, true},        {"--mirror", O_MIRROR, true},  {"--source-bootstrap", O_SOURCE, true},
	{"--config", O_CONFIG, true},     {"--config-file", O_CONFIG_FILE, true},
	{"--validate-only", O_VALIDATE, false}, {"--delete-config", O_DELETE_CONFIG, true},
	{"--topics", O_TOPICS, true},     {"--topic", O_TOPICS, true}, {"--topics-regex", O_TOPICS_REGEX, true},
	{"--dry-run", O_DRY_RUN, false},  {"--wait-ms", O_WAIT, true},
	{"--peer-bootstrap", O_PEER, true}, {"--peer-mirror", O_PEER, true},
	{"--admin", O_SWAP, true},        {"--token-file", O_SWAP, true}, {"--to", O_SWAP, true},
	{"--admin-ca", O_SWAP, true},     {"--adopt-existing", O_ADOPT, false},
};

static const opt_def *opt_lookup(const char *name, size_t n)
{
	for (size_t i = 0; i < sizeof(opt_defs) / sizeof(opt_defs[0]); i++)
		if (strlen(opt_defs[i].name) == n && !strncmp(opt_defs[i].name, name, n))
			return &opt_defs[i];
	return NULL;
}

/* Edit distance (insertions, deletions, substitutions) between a and b[0..n), stopping at cap. */
static size_t distance(const char *a, const char *b, size_t n, size_t cap)
{
	size_t la = strlen(a), row[64], prev;

	if (la >= sizeof(row) / sizeof(row[0]) || n >= 64)
		return cap;
	for (size_t j = 0; j <= n; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t best;
		prev = row[0];
		row[0] = i;
		best = row[0];
		for (size_t j = 1; j <= n; j++) {
			size_t cur = row[j], v = prev + (a[i - 1] != b[j - 1]);
			if (row[j] + 1 < v)
				v = row[j] + 1;
			if (row[j - 1] + 1 < v)
				v = row[j - 1] + 1;
			row[j] = v;
			prev = cur;
			if (v < best)
				best = v;
		}
		if (best >= cap)
			return cap;
	}
	return row[n];
}

/* The option nearest to name[0..n) (at most 3 edits away), for "did you mean", or NULL. */
static const char *nearest_opt(const char *name, size_t n)
{
	const char *best = NULL;
	size_t bd = 4;
	for (size_t i = 0; i < sizeof(opt_defs) / sizeof(opt_defs[0]); i++) {
		size_t d = distance(opt_defs[i].name, name, n, bd);
		if (d < bd) {
			bd = d;
			best = opt_defs[i].name;
		}
	}
	return best;
}

static int set_once(const char **slot, const char *value, const char *name, char *err, size_t errlen)
{
	if (*slot)
		return fail(err, errlen, "%s given twice", name);
	*slot = value;
	return KM_CLI_EXIT_OK;
}

/* One option with its value (NULL for a flag). */
static int apply_opt(km_cli_args *a, const opt_def *o, const char *v, km_cli_kvs *cli_configs,
		     km_cli_kvs *deletes, char *err, size_t errlen)
{
	const char *n = o->name;

	if (!strcmp(n, "--bootstrap-server"))
		return set_once(&a->bootstrap, v, n, err, errlen);
	if (!strcmp(n, "--command-config"))
		return set_once(&a->command_config, v, n, err, errlen);
	if (!strcmp(n, "--output")) {
		if (!strcmp(v, "json"))
			a->json = true;
		else if (!strcmp(v, "table"))
			a->json = false;
		else
			return fail(err, errlen, "--output '%s': expected table or json", v);
		return KM_CLI_EXIT_OK;
	}
	if (!strcmp(n, "--timeout-ms")) {
		char *end;
		long long t;
		errno = 0;
		t = strtoll(v, &end, 10);
		if (errno || end == v || *end || t <= 0 || t > MAX_TIMEOUT_MS)
			return fail(err, errlen, "--timeout-ms '%s': expected milliseconds from 1 to %lld", v,
				    MAX_TIMEOUT_MS);
		a->timeout_ms = t;
		return KM_CLI_EXIT_OK;
	}
	if (!strcmp(n, "--admin"))
		return set_once(&a->admin, v, n, err, errlen);
	if (!strcmp(n, "--token-file"))
		return set_once(&a->token_file, v, n, err, errlen);
	if (!strcmp(n, "--admin-ca"))
		return set_once(&a->admin_ca, v, n, err, errlen);
	if (!strcmp(n, "--to")) {
		if (!*v)
			return fail(err, errlen, "--to: empty upstream (HOST:PORT[,HOST:PORT...])");
		return set_once(&a->to, v, n, err, errlen);
	}
	if (!strcmp(n, "--peer-bootstrap"))
		return set_once(&a->peer_bootstrap, v, n, err, errlen);
	if (!strcmp(n, "--peer-mirror")) {
		if (!*v)
			return fail(err, errlen, "--peer-mirror: empty name");
		return set_once(&a->peer_mirror, v, n, err, errlen);
	}
	if (!strcmp(n, "--wait-ms")) {
		char *end;
		long long t;
		errno = 0;
		t = strtoll(v, &end, 10);
		if (errno || end == v || *end || t < 0 || t > 86400000LL)
			return fail(err, errlen, "--wait-ms '%s': expected milliseconds from 0 to 86400000", v);
		a->wait_ms = t;
		return KM_CLI_EXIT_OK;
	}
	if (!strcmp(n, "--mirror")) {
		if (!*v)
			return fail(err, errlen, "--mirror: empty name");
		return set_once(&a->mirror, v, n, err, errlen);
	}
	if (!strcmp(n, "--source-bootstrap"))
		return set_once(&a->source_bootstrap, v, n, err, errlen);
	if (!strcmp(n, "--config"))
		return parse_config(a, v, cli_configs, err, errlen);
	if (!strcmp(n, "--config-file"))
		return set_once(&a->config_file, v, n, err, errlen);
	if (!strcmp(n, "--validate-only")) {
		a->validate_only = true;
		return KM_CLI_EXIT_OK;
	}
	if (!strcmp(n, "--dry-run")) {
		a->dry_run = true;
		return KM_CLI_EXIT_OK;
	}
	if (!strcmp(n, "--adopt-existing")) {
		a->adopt_existing = true;
		return KM_CLI_EXIT_OK;
	}
	if (!strcmp(n, "--delete-config")) {
		if (!*v)
			return fail(err, errlen, "--delete-config: empty key");
		return km_cli_kvs_set(deletes, v, NULL) ? KM_CLI_EXIT_OK : fail(err, errlen, "out of memory");
	}
	if (!strcmp(n, "--topics") || !strcmp(n, "--topic")) /* --topic: Kafka's tools' name */
		return parse_topics(v, a, err, errlen);
	if (!strcmp(n, "--topics-regex")) {
		if (!*v)
			return fail(err, errlen, "--topics-regex: empty expression");
		return set_once(&a->topics_regex, v, n, err, errlen);
	}
	return fail(err, errlen, "%s: not handled", n);
}

/* The checks that need every option: required ones, exclusive ones, the create configs. */
static int finish(km_cli_args *a, km_cli_kvs *cli_configs, km_cli_kvs *deletes, char *err, size_t errlen)
{
	const char *cmd = km_cli_cmd_name(a->cmd);
	const km_cli_kv *bs;

	if (a->cmd == KM_CLI_CMD_SWAP_UPSTREAM) {
		if (!a->admin || !a->token_file || !a->to)
			return fail(err, errlen, "swap-upstream: --admin, --token-file and --to are required");
		return KM_CLI_EXIT_OK;
	}
	if (!a->bootstrap && (a->bootstrap = getenv("KMIRROR_BOOTSTRAP_SERVER")) && !*a->bootstrap)
		a->bootstrap = NULL;
	if (!a->bootstrap)
		return fail(err, errlen, "--bootstrap-server is required (kmirrord's address; or set KMIRROR_BOOTSTRAP_SERVER)");
	switch (a->cmd) {
	case KM_CLI_CMD_CREATE:
	case KM_CLI_CMD_ALTER:
	case KM_CLI_CMD_DELETE:
	case KM_CLI_CMD_START:
	case KM_CLI_CMD_STOP:
	case KM_CLI_CMD_PROMOTE:
	case KM_CLI_CMD_REVERSE:
	case KM_CLI_CMD_PAUSE:
	case KM_CLI_CMD_RESUME:
	case KM_CLI_CMD_LAST_OFFSETS:
		if (!a->mirror)
			return fail(err, errlen, "%s: --mirror is required", cmd);
		break;
	default:
		break;
	}
	if (a->cmd == KM_CLI_CMD_START || a->cmd == KM_CLI_CMD_STOP || a->cmd == KM_CLI_CMD_PAUSE ||
	    a->cmd == KM_CLI_CMD_RESUME || a->cmd == KM_CLI_CMD_PROMOTE || a->cmd == KM_CLI_CMD_REVERSE) {
		if (a->topics && a->topics_regex)
			return fail(err, errlen, "%s: give --topics or --topics-regex, not both", cmd);
		if (!a->topics && !a->topics_regex)
			return fail(err, errlen, "%s: --topics or --topics-regex is required", cmd);
	}
	if (a->cmd == KM_CLI_CMD_REVERSE && (!a->peer_bootstrap || !a->peer_mirror))
		return fail(err, errlen, "reverse: --peer-bootstrap and --peer-mirror are required");
	/* The file first, then --config on top of it. */
	if (a->config_file) {
		char why[512];
		if (km_cli_props_load(a->config_file, &a->configs, why, sizeof(why)) != KM_OK)
			return fail(err, errlen, "--config-file: %s", why);
	}
	for (size_t i = 0; i < cli_configs->count; i++)
		if (!km_cli_kvs_set(&a->configs, cli_configs->items[i].name, cli_configs->items[i].value))
			return fail(err, errlen, "out of memory");
	if (a->cmd == KM_CLI_CMD_CREATE) {
		bs = km_cli_kvs_get(&a->configs, "bootstrap.servers");
		if (a->source_bootstrap && bs && bs->value && strcmp(bs->value, a->source_bootstrap) != 0)
			return fail(err, errlen, "create: --source-bootstrap %s and bootstrap.servers=%s disagree",
				    a->source_bootstrap, bs->value);
		if (!a->source_bootstrap && !bs)
			return fail(err, errlen, "create: --source-bootstrap is required");
		if (a->source_bootstrap && !km_cli_kvs_set(&a->configs, "bootstrap.servers", a->source_bootstrap))
			return fail(err, errlen, "out of memory");
	}
	if (a->cmd == KM_CLI_CMD_ALTER) {
		for (size_t i = 0; i < deletes->count; i++) {
			if (km_cli_kvs_get(&a->configs, deletes->items[i].name))
				return fail(err, errlen, "alter: %s is both set and deleted", deletes->items[i].name);
			if (!km_cli_kvs_set(&a->configs, deletes->items[i].name, NULL))
				return fail(err, errlen, "out of memory");
		}
		if (a->configs.count == 0)
			return fail(err, errlen, "alter: nothing to change (give --config or --delete-config)");
	}
	return KM_CLI_EXIT_OK;
}

int km_cli_parse(int argc, char **argv, km_cli_args *a, char *err, size_t errlen)
{
	km_cli_kvs cli_configs = {0}, deletes = {0};
	const cmd_info *ci = NULL;
	int rc = KM_CLI_EXIT_OK;

	memset(a, 0, sizeof(*a));
	a->timeout_ms = DEFAULT_TIMEOUT_MS;
	a->wait_ms = 60000;
	err[0] = 0;
	for (int i = 1; i < argc && rc == KM_CLI_EXIT_OK; i++) {
		const char *arg = argv[i], *eq, *v = NULL;
		const opt_def *o;

		if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
			a->help = true;
			goto out;
		}
		if (!strcmp(arg, "--version")) {
			a->version = true;
			goto out;
		}
		if (strncmp(arg, "--", 2) != 0) {
			if (!ci && !strcmp(arg, "help")) {
				/* kmirror help [COMMAND]: COMMAND's usage, or the whole list. */
				a->help = true;
				for (size_t k = 0; i + 1 < argc && k < sizeof(cmds) / sizeof(cmds[0]); k++)
					if (!strcmp(cmds[k].name, argv[i + 1]))
						a->cmd = cmds[k].cmd;
				if (i + 1 < argc && a->cmd == KM_CLI_CMD_NONE) {
					rc = fail(err, errlen, "help: unknown command '%s' (kmirror help lists them)", argv[i + 1]);
					a->help = false;
				}
				goto out;
			}
			if (ci) {
				rc = fail(err, errlen, "%s: unexpected argument '%s'", ci->name, arg);
				break;
			}
			for (size_t k = 0; k < sizeof(cmds) / sizeof(cmds[0]); k++)
				if (!strcmp(cmds[k].name, arg))
					ci = &cmds[k];
			if (!ci) {
				rc = fail(err, errlen, "unknown command '%s' (try --help)", arg);
				break;
			}
			a->cmd = ci->cmd;
			continue;
		}
		eq = strchr(arg, '=');
		o = opt_lookup(arg, eq ? (size_t)(eq - arg) : strlen(arg));
		if (!o) {
			size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
			const char *near = nearest_opt(arg, n);
			if (near)
				rc = fail(err, errlen, "unknown option '%.*s' (did you mean %s? try --help)", (int)n, arg, near);
			else
				rc = fail(err, errlen, "unknown option '%.*s' (try --help)", (int)n, arg);
			break;
		}
		if (o->bit && (!ci || !(ci->opts & o->bit))) {
			rc = ci ? fail(err, errlen, "%s does not take %s (try kmirror %s --help)", ci->name, o->name,
				       ci->name)
				: fail(err, errlen, "%s comes after the command (try --help)", o->name);
			break;
		}
		if (o->has_value) {
			if (eq)
				v = eq + 1;
			else if (i + 1 < argc)
				v = argv[++i];
			else {
				rc = fail(err, errlen, "%s needs a value", o->name);
				break;
			}
		} else if (eq) {
			rc = fail(err, errlen, "%s takes no value", o->name);
			break;
		}
		rc = apply_opt(a, o, v, &cli_configs, &deletes, err, errlen);
	}
	if (rc == KM_CLI_EXIT_OK && !ci)
		rc = fail(err, errlen, "no command given (try --help)");
	if (rc == KM_CLI_EXIT_OK)
		rc = finish(a, &cli_configs, &deletes, err, errlen);
out:
	km_cli_kvs_free(&cli_configs);
	km_cli_kvs_free(&deletes);
	return rc;
}

void km_cli_args_free(km_cli_args *a)
{
	for (size_t i = 0; i < a->ntopics; i++)
		free(a->topics[i]);
	free(a->topics);
	km_cli_kvs_free(&a->configs);
	memset(a, 0, sizeof(*a));
}
