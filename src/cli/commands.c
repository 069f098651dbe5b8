/* kmirror CLI commands: calling kmirrord, the errors it answers, create, alter, delete, list, and running a command. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

#include "cli/commands.h"
#include "kmirror/api.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/alter_mirror_request.h"
#include "kmirror/msg/alter_mirror_response.h"
#include "kmirror/msg/create_mirror_request.h"
#include "kmirror/msg/create_mirror_response.h"
#include "kmirror/msg/delete_mirror_request.h"
#include "kmirror/msg/delete_mirror_response.h"
#include "kmirror/msg/list_mirrors_request.h"
#include "kmirror/msg/list_mirrors_response.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/metadata_response.h"


void km_cmd_say_err(ctx *x, const char *fmt, ...)
{
	va_list ap;
	fprintf(x->err, "kmirror: %s: ", x->cmd);
	va_start(ap, fmt);
	vfprintf(x->err, fmt, ap);
	va_end(ap);
	fputc('\n', x->err);
}

/* The server's message, or the code's default one. */
void km_cmd_message_of(int16_t code, km_str msg, char *buf, size_t len)
{
	if (msg.len >= 0)
		snprintf(buf, len, "%.*s", (int)msg.len, msg.p);
	else
		snprintf(buf, len, "%s", km_err_message(code));
	for (char *q = buf; *q; q++)
		if (*q == '\n' || *q == '\r')
			*q = ' ';
}

void km_cmd_json_error(km_cli_json *j, int16_t code, km_str msg)
{
	char m[1024];
	if (code == 0) {
		km_cli_json_null(j);
		return;
	}
	km_cmd_message_of(code, msg, m, sizeof(m));
	km_cli_json_obj(j);
	km_cli_json_key(j, "code");
	km_cli_json_int(j, code);
	km_cli_json_key(j, "name");
	km_cli_json_str(j, km_err_name(code));
	km_cli_json_key(j, "message");
	km_cli_json_str(j, m);
	km_cli_json_obj_end(j);
}

/* A top-level error: one line on stderr, and with --output json a document on stdout too. */
int km_cmd_top_error(ctx *x, int16_t code, km_str msg)
{
	char m[1024];
	km_cmd_message_of(code, msg, m, sizeof(m));
	km_cmd_say_err(x, "%s: %s", km_err_name(code), m);
	if (x->a->json) {
		km_cli_json j;
		km_cli_json_init(&j, x->out);
		km_cli_json_obj(&j);
		km_cli_json_key(&j, "error");
		km_cmd_json_error(&j, code, msg);
		km_cli_json_obj_end(&j);
	}
	return KM_CLI_EXIT_ERROR;
}

/* The top-level error code of a mirror RPC's response: every one starts ThrottleTimeMs, ErrorCode. */
static int16_t mirror_top_error(int16_t api_key, const uint8_t *body, size_t len)
{
	if (api_key < KM_API_CREATE_MIRROR || len < 6)
		return 0;
	return (int16_t)((uint16_t)body[4] << 8 | body[5]);
}

/*
 * Send w (checked) as api_key at the negotiated version; on success r reads the response body.
 * While kmirrord is still reading __mirror_state back it answers COORDINATOR_LOAD_IN_PROGRESS,
 * having done nothing: the request is sent again until --timeout-ms, as Kafka's tools retry.
 */
/* A request may carry a mirror's secrets (create, alter): wiped before its buffer is freed. */
static void wr_wipe_free(km_wr *w)
{
	if (w->buf)
		OPENSSL_cleanse(w->buf, w->cap);
	km_wr_free(w);
}

bool km_cmd_call(ctx *x, int16_t api_key, km_wr *w, int16_t version, km_rd *r)
{
	int64_t deadline = km_mono_ms() + x->a->timeout_ms;
	char why[512];
	km_err rc;

	if (!km_wr_ok(w)) {
		km_cmd_say_err(x, "cannot encode the request: %s", km_err_name(w->err));
		wr_wipe_free(w);
		return false;
	}
	for (;;) {
		free(x->resp);
		x->resp = NULL;
		rc = km_cli_call(x->cc, api_key, version, w->buf, w->len, &x->resp, &x->resp_len, why, sizeof(why));
		if (rc != KM_OK || mirror_top_error(api_key, x->resp, x->resp_len) != KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS ||
		    km_mono_ms() + RETRY_BACKOFF_MS > deadline)
			break;
		nanosleep(&(struct timespec){0, RETRY_BACKOFF_MS * 1000000L}, NULL);
	}
	wr_wipe_free(w);
	if (rc != KM_OK) {
		km_cmd_say_err(x, "%s", why);
		return false;
	}
	km_rd_init(r, x->resp, x->resp_len);
	return true;
}

bool km_cmd_decoded(ctx *x, km_err rc, int16_t api_key, int16_t version, const km_rd *r)
{
	char why[256];
	if (rc == KM_OK)
		return true;
	km_codec_strerror(why, sizeof(why), api_key, version, r);
	km_cmd_say_err(x, "malformed response: %s", why);
	return false;
}

bool km_cmd_rpc(ctx *x, int16_t api_key, int16_t version, const void *req, void *resp)
{
	const km_api_info *api = km_api_lookup(api_key);
	km_wr w;
	km_rd r;

	if (!api || !api->request.encode || !api->response.decode) {
		km_cmd_say_err(x, "no codec for api key %d", api_key);
		return false;
	}
	km_wr_init(&w);
	api->request.encode(&w, version, req);
	if (!km_cmd_call(x, api_key, &w, version, &r))
		return false;
	api->response.init(resp);
	return km_cmd_decoded(x, api->response.decode(&r, version, resp, &x->arena), api_key, version, &r);
}

bool km_cmd_topic_names(ctx *x, km_str **names, size_t *n, char *why, size_t whylen)
{
	int16_t v = km_cli_conn_version(x->cc, KM_API_METADATA);
	km_metadata_request m;
	km_metadata_response mr;

	*names = NULL;
	*n = 0;
	if (v < 1) {
		snprintf(why, whylen, "does not answer Metadata v1 or later");
		return false;
	}
	km_metadata_request_init(&m);
	m.topics.count = -1; /* all topics */
	m.allow_auto_topic_creation = false;
	if (!km_cmd_rpc(x, KM_API_METADATA, v > 12 ? 12 : v, &m, &mr))
		return false;
	if (!(*names = km_arena_calloc(&x->arena, ((size_t)(mr.topics.count > 0 ? mr.topics.count : 0) + 1) *
							sizeof(km_str))))
		return false;
	for (int32_t i = 0; i < mr.topics.count; i++) {
		const km_metadata_response_topic *t = &mr.topics.items[i];
		char *copy;
		if (t->error_code || t->is_internal || t->name.len <= 0 || km_str_eq_c(t->name, MIRROR_STATE_TOPIC) ||
		    !(copy = km_arena_alloc(&x->arena, (size_t)t->name.len + 1)))
			continue;
		memcpy(copy, t->name.p, (size_t)t->name.len);
		copy[t->name.len] = 0;
		(*names)[(*n)++] = km_str_c(copy);
	}
	return true;
}

/* The version of a mirror RPC kmirrord offers (every one is v0 today), or -1 with an error said. */
int16_t km_cmd_version_of(ctx *x, int16_t api_key)
{
	int16_t v = km_cli_conn_version(x->cc, api_key);
	if (v < 0)
		km_cmd_say_err(x, "kmirrord does not offer this command's RPC (api key %d): it is older than this kmirror",
			api_key);
	return v;
}

/* ---- create, alter, delete ---- */

static int cmd_create(ctx *x)
{
	const km_cli_args *a = x->a;
	int16_t v = km_cmd_version_of(x, KM_API_CREATE_MIRROR);
	km_create_mirror_request m;
	km_create_mirror_request_mirror_config *cfg;
	km_create_mirror_response resp;

	if (v < 0)
		return KM_CLI_EXIT_ERROR;
	cfg = km_arena_calloc(&x->arena, (a->configs.count ? a->configs.count : 1) * sizeof(*cfg));
	if (!cfg)
		return KM_CLI_EXIT_ERROR;
	km_create_mirror_request_init(&m);
	m.mirror_name = km_str_c(a->mirror);
	for (size_t i = 0; i < a->configs.count; i++) {
		km_create_mirror_request_mirror_config_init(&cfg[i]);
		cfg[i].name = km_str_c(a->configs.items[i].name);
		cfg[i].value = km_str_c(a->configs.items[i].value);
	}
	m.configs.items = cfg;
	m.configs.count = (int32_t)a->configs.count;
	m.validate_only = a->validate_only;
	if (!km_cmd_rpc(x, KM_API_CREATE_MIRROR, v, &m, &resp))
		return KM_CLI_EXIT_ERROR;
	if (resp.error_code)
		return km_cmd_top_error(x, resp.error_code, resp.error_message);
	if (a->json) {
		km_cli_json j;
		km_cli_json_init(&j, x->out);
		km_cli_json_obj(&j);
		km_cli_json_key(&j, "mirror");
		km_cli_json_str(&j, a->mirror);
		km_cli_json_key(&j, "created");
		km_cli_json_bool(&j, !a->validate_only);
		km_cli_json_key(&j, "validate_only");
		km_cli_json_bool(&j, a->validate_only);
		km_cli_json_obj_end(&j);
	} else if (a->validate_only)
		fprintf(x->out, "Mirror %s is valid (validate only: nothing was created).\n", a->mirror);
	else
		fprintf(x->out, "Created mirror %s.\n", a->mirror);
	return KM_CLI_EXIT_OK;
}

static int cmd_alter(ctx *x)
{
	const km_cli_args *a = x->a;
	int16_t v = km_cmd_version_of(x, KM_API_ALTER_MIRROR);
	km_alter_mirror_request m;
	km_alter_mirror_request_mirror_config *cfg;
	km_alter_mirror_response resp;

	if (v < 0)
		return KM_CLI_EXIT_ERROR;
	cfg = km_arena_calloc(&x->arena, (a->configs.count ? a->configs.count : 1) * sizeof(*cfg));
	if (!cfg)
		return KM_CLI_EXIT_ERROR;
	km_alter_mirror_request_init(&m);
	m.mirror_name = km_str_c(a->mirror);
	for (size_t i = 0; i < a->configs.count; i++) {
		km_alter_mirror_request_mirror_config_init(&cfg[i]);
		cfg[i].name = km_str_c(a->configs.items[i].name);
		cfg[i].value = km_str_c(a->configs.items[i].value); /* NULL: delete */
	}
	m.configs.items = cfg;
	m.configs.count = (int32_t)a->configs.count;
	if (!km_cmd_rpc(x, KM_API_ALTER_MIRROR, v, &m, &resp))
		return KM_CLI_EXIT_ERROR;
	if (resp.error_code)
		return km_cmd_top_error(x, resp.error_code, resp.error_message);
	if (a->json) {
		km_cli_json j;
		km_cli_json_init(&j, x->out);
		km_cli_json_obj(&j);
		km_cli_json_key(&j, "mirror");
		km_cli_json_str(&j, a->mirror);
		km_cli_json_key(&j, "altered");
		km_cli_json_bool(&j, true);
		km_cli_json_obj_end(&j);
	} else
		fprintf(x->out, "Altered mirror %s.\n", a->mirror);
	return KM_CLI_EXIT_OK;
}

static int cmd_delete(ctx *x)
{
	const km_cli_args *a = x->a;
	int16_t v = km_cmd_version_of(x, KM_API_DELETE_MIRROR);
	km_delete_mirror_request m;
	km_delete_mirror_response resp;

	if (v < 0)
		return KM_CLI_EXIT_ERROR;
	km_delete_mirror_request_init(&m);
	m.mirror_name = km_str_c(a->mirror);
	if (!km_cmd_rpc(x, KM_API_DELETE_MIRROR, v, &m, &resp))
		return KM_CLI_EXIT_ERROR;
	if (resp.error_code)
		return km_cmd_top_error(x, resp.error_code, resp.error_message);
	if (a->json) {
		km_cli_json j;
		km_cli_json_init(&j, x->out);
		km_cli_json_obj(&j);
		km_cli_json_key(&j, "mirror");
		km_cli_json_str(&j, a->mirror);
		km_cli_json_key(&j, "deleted");
		km_cli_json_bool(&j, true);
		km_cli_json_obj_end(&j);
	} else
		fprintf(x->out, "Deleted mirror %s.\n", a->mirror);
	return KM_CLI_EXIT_OK;
}

/* ---- list ---- */

static void json_instances(km_cli_json *j, const km_list_mirrors_response *resp)
{
	km_cli_json_key(j, "instances");
	km_cli_json_arr(j);
	for (int32_t i = 0; i < resp->instances.count; i++) {
		const km_list_mirrors_response_listed_instance *in = &resp->instances.items[i];
		km_cli_json_obj(j);
		km_cli_json_key(j, "id");
		km_cli_json_strn(j, in->instance_id.p, in->instance_id.len);
		km_cli_json_key(j, "report_age_ms");
		km_cli_json_int(j, in->report_age_ms);
		km_cli_json_key(j, "start_time_ms");
		km_cli_json_int(j, in->start_time_ms);
		km_cli_json_key(j, "state_delay_ms");
		km_cli_json_int(j, in->state_delay_ms);
		km_cli_json_key(j, "pipelines");
		km_cli_json_strn(j, in->pipelines.p, in->pipelines.len);
		km_cli_json_key(j, "version");
		km_cli_json_strn(j, in->software_version.p, in->software_version.len);
		km_cli_json_key(j, "owned_mirrors");
		km_cli_json_arr(j);
		for (int32_t k = 0; k < in->owned_mirrors.count; k++)
			km_cli_json_strn(j, in->owned_mirrors.items[k].p, in->owned_mirrors.items[k].len);
		km_cli_json_arr_end(j);
		km_cli_json_key(j, "is_self");
		km_cli_json_bool(j, in->is_self);
		km_cli_json_obj_end(j);
	}
	km_cli_json_arr_end(j);
}

/* The kmirrords in front of the destination, as each last reported itself (every 10 s). */
static bool print_instances(ctx *x, const km_list_mirrors_response *resp)
{
	static const char *const hdr[] = {"INSTANCE", "LAST REPORT", "STATE DELAY", "PIPELINES", "VERSION", "RUNS"};
	km_cli_table t;
	if (!resp->instances.count)
		return true;
	if (!km_cli_table_init(&t, sizeof(hdr) / sizeof(hdr[0]), hdr))
		return false;
	for (int32_t i = 0; i < resp->instances.count; i++) {
		const km_list_mirrors_response_listed_instance *in = &resp->instances.items[i];
		char id[640], age[32], delay[32], pipes[16], ver[64], runs[1024];
		const char *row[] = {id, age, delay, pipes, ver, runs};
		size_t at = 0;
		snprintf(id, sizeof(id), "%.*s%s", (int)in->instance_id.len, in->instance_id.p, in->is_self ? " (this one)" : "");
		snprintf(age, sizeof(age), "%.1f s ago", (double)in->report_age_ms / 1000.0);
		if (in->state_delay_ms < 0)
			snprintf(delay, sizeof(delay), "-");
		else
			snprintf(delay, sizeof(delay), "%lld ms", (long long)in->state_delay_ms);
		snprintf(pipes, sizeof(pipes), "%.*s", (int)in->pipelines.len, in->pipelines.p);
		snprintf(ver, sizeof(ver), "%.*s", (int)in->software_version.len, in->software_version.p);
		runs[0] = 0;
		for (int32_t k = 0; k < in->owned_mirrors.count && at < sizeof(runs) - 1; k++)
			at += (size_t)snprintf(runs + at, sizeof(runs) - at, "%s%.*s", k ? "," : "",
					       (int)in->owned_mirrors.items[k].len, in->owned_mirrors.items[k].p);
		if (!in->owned_mirrors.count)
			snprintf(runs, sizeof(runs), "-");
		km_cli_table_row(&t, row);
	}
	fprintf(x->out, "\n");
	km_cli_table_print(&t, x->out);
	km_cli_table_free(&t);
	return true;
}

static int cmd_list(ctx *x)
{
	int16_t v = km_cmd_version_of(x, KM_API_LIST_MIRRORS);
	km_list_mirrors_request m;
	km_list_mirrors_response resp;

	if (v < 0)
		return KM_CLI_EXIT_ERROR;
	km_list_mirrors_request_init(&m);
	if (!km_cmd_rpc(x, KM_API_LIST_MIRRORS, v, &m, &resp))
		return KM_CLI_EXIT_ERROR;
	if (resp.error_code)
		return km_cmd_top_error(x, resp.error_code, resp.error_message);
	if (x->a->json) {
		km_cli_json j;
		km_cli_json_init(&j, x->out);
		km_cli_json_obj(&j);
		km_cli_json_key(&j, "mirrors");
		km_cli_json_arr(&j);
		for (int32_t i = 0; i < resp.mirrors.count; i++) {
			const km_list_mirrors_response_listed_mirror *lm = &resp.mirrors.items[i];
			km_cli_json_obj(&j);
			km_cli_json_key(&j, "name");
			km_cli_json_strn(&j, lm->mirror_name.p, lm->mirror_name.len);
			km_cli_json_key(&j, "source_bootstrap_servers");
			km_cli_json_strn(&j, lm->source_bootstrap_servers.p, lm->source_bootstrap_servers.len);
			km_cli_json_key(&j, "topic_count");
			km_cli_json_int(&j, lm->topic_count);
			km_cli_json_obj_end(&j);
		}
		km_cli_json_arr_end(&j);
		json_instances(&j, &resp);
		km_cli_json_obj_end(&j);
	} else {
		static const char *const hdr[] = {"MIRROR", "SOURCE", "TOPICS"};
		km_cli_table t;
		if (!km_cli_table_init(&t, sizeof(hdr) / sizeof(hdr[0]), hdr))
			return KM_CLI_EXIT_ERROR;
		for (int32_t i = 0; i < resp.mirrors.count; i++) {
			const km_list_mirrors_response_listed_mirror *lm = &resp.mirrors.items[i];
			char name[512], src[1024], n[16];
			const char *row[] = {name, src, n};
			snprintf(name, sizeof(name), "%.*s", (int)lm->mirror_name.len, lm->mirror_name.p);
			snprintf(src, sizeof(src), "%.*s", (int)lm->source_bootstrap_servers.len,
				 lm->source_bootstrap_servers.p);
			snprintf(n, sizeof(n), "%d", lm->topic_count);
			km_cli_table_row(&t, row);
		}
		km_cli_table_print(&t, x->out);
		km_cli_table_free(&t);
		if (!print_instances(x, &resp))
			return KM_CLI_EXIT_ERROR;
	}
	return KM_CLI_EXIT_OK;
}

/* ---- run ---- */

/* A missing or unreadable TLS file is a mistake in the properties: say which property, before connecting. */
static bool tls_files_readable(const km_cli_client *cl, const char *props, FILE *errf)
{
	const struct {
		const char *prop, *path;
	} files[] = {
		{"ssl.ca.location", cl->ca_file},
		{"ssl.certificate.location", cl->cert_file},
		{"ssl.key.location", cl->key_file},
		{"ssl.truststore.location", cl->truststore.location},
		{"ssl.keystore.location", cl->keystore.location},
	};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		FILE *f;
		if (!files[i].path)
			continue;
		if (!(f = fopen(files[i].path, "r"))) {
			fprintf(errf, "kmirror: --command-config %s: %s %s: %s\n", props ? props : "", files[i].prop,
				files[i].path, strerror(errno));
			return false;
		}
		fclose(f);
	}
	return true;
}

/* A connection to bootstrap with --command-config's settings; NULL with *rc the exit code (said on errf). */
km_cli_conn *km_cmd_open_conn(const km_cli_args *a, const char *bootstrap, FILE *errf, int *rc)
{
	char err[1024] = "";
	km_cli_conn *cc = km_cmd_connect(a, bootstrap, true, a->timeout_ms, errf, err, sizeof(err), rc);
	if (!cc && err[0])
		fprintf(errf, "kmirror: %s\n", err); /* the reason names the address */
	return cc;
}

km_cli_conn *km_cmd_connect(const km_cli_args *a, const char *bootstrap, bool kmirrord, int64_t timeout_ms, FILE *errf,
			    char *err, size_t errlen, int *rc)
{
	km_cli_client cl = {0};
	km_cli_kvs props = {0};
	km_cli_conn *cc;
	char why[1024], warn[512];

	*rc = KM_CLI_EXIT_USAGE;
	if (a->command_config) {
		if (km_cli_props_load(a->command_config, &props, why, sizeof(why)) != KM_OK) {
			fprintf(errf, "kmirror: --command-config: %s\n", why);
			return NULL;
		}
	}
	if (km_cli_client_from_props(&props, &cl, why, sizeof(why), warn, sizeof(warn)) != KM_OK) {
		fprintf(errf, "kmirror: --command-config %s: %s\n", a->command_config ? a->command_config : "", why);
		km_cli_kvs_free(&props);
		return NULL;
	}
	km_cli_kvs_free(&props);
	if (!tls_files_readable(&cl, a->command_config, errf)) {
		km_cli_client_free(&cl);
		return NULL;
	}
	if (warn[0])
		fprintf(errf, "kmirror: --command-config: ignoring properties kmirror does not use: %s\n", warn);
	cc = km_cli_connect(bootstrap, &cl, timeout_ms, kmirrord, err, errlen);
	km_cli_client_free(&cl);
	if (!cc)
		*rc = KM_CLI_EXIT_ERROR;
	return cc;
}

int km_cli_run(const km_cli_args *a, FILE *out, FILE *errf)
{
	ctx x = {.a = a, .out = out, .err = errf, .cmd = km_cli_cmd_name(a->cmd)};
	int rc;

	if (a->cmd == KM_CLI_CMD_SWAP_UPSTREAM)
		return km_cli_swap_upstream(a, out, errf);
	if (!(x.cc = km_cmd_open_conn(a, a->bootstrap, errf, &rc)))
		return rc;
	km_arena_init(&x.arena, ARENA_CAP);
	switch (a->cmd) {
	case KM_CLI_CMD_CREATE: rc = cmd_create(&x); break;
	case KM_CLI_CMD_LIST: rc = cmd_list(&x); break;
	case KM_CLI_CMD_DESCRIBE: rc = km_cmd_describe(&x); break;
	case KM_CLI_CMD_ALTER: rc = cmd_alter(&x); break;
	case KM_CLI_CMD_DELETE: rc = cmd_delete(&x); break;
	case KM_CLI_CMD_START:
	case KM_CLI_CMD_STOP:
	case KM_CLI_CMD_PROMOTE:
	case KM_CLI_CMD_PAUSE:
	case KM_CLI_CMD_RESUME: rc = km_cmd_topics(&x); break;
	case KM_CLI_CMD_LAST_OFFSETS: rc = km_cmd_last_offsets(&x); break;
	case KM_CLI_CMD_REVERSE: rc = km_cmd_reverse(&x); break;
	default: rc = KM_CLI_EXIT_USAGE; break;
	}
	if (km_arena_err(&x.arena) != KM_OK && rc == KM_CLI_EXIT_OK) {
		km_cmd_say_err(&x, "out of memory");
		rc = KM_CLI_EXIT_ERROR;
	}
	fflush(out);
	free(x.resp);
	km_arena_free(&x.arena);
	km_cli_conn_free(x.cc);
	return rc;
}
