/* kmirror CLI commands: each builds its mirror RPC with the generated codec, calls kmirrord, and prints a table or JSON. */
#include <errno.h>
#include <regex.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "kmirror/arena.h"
#include "kmirror/msg/alter_mirror_request.h"
#include "kmirror/msg/alter_mirror_response.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/create_mirror_request.h"
#include "kmirror/msg/create_mirror_response.h"
#include "kmirror/msg/delete_mirror_request.h"
#include "kmirror/msg/delete_mirror_response.h"
#include "kmirror/msg/describe_mirrors_request.h"
#include "kmirror/msg/describe_mirrors_response.h"
#include "kmirror/msg/last_mirrored_offsets_request.h"
#include "kmirror/msg/last_mirrored_offsets_response.h"
#include "kmirror/msg/list_offsets_request.h"
#include "kmirror/msg/list_offsets_response.h"
#include "kmirror/msg/list_mirrors_request.h"
#include "kmirror/msg/list_mirrors_response.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/msg/pause_mirror_topics_request.h"
#include "kmirror/msg/pause_mirror_topics_response.h"
#include "kmirror/msg/resume_mirror_topics_request.h"
#include "kmirror/msg/resume_mirror_topics_response.h"
#include "kmirror/msg/start_mirror_topics_request.h"
#include "kmirror/msg/start_mirror_topics_response.h"
#include "kmirror/msg/stop_mirror_topics_request.h"
#include "kmirror/msg/stop_mirror_topics_response.h"

#define ARENA_CAP ((size_t)256 << 20) /* a describe of many mirrors with many partitions */
#define SECRET_SHOWN "(secret)"
#define MIRROR_STATE_TOPIC "__mirror_state"
#define RETRY_BACKOFF_MS 200 /* between retries of a request kmirrord could not serve yet */

typedef struct ctx {
	const km_cli_args *a;
	FILE *out, *err;
	km_cli_conn *cc;
	km_arena arena;
	uint8_t *resp; /* the last response body; decoded strings borrow it */
	size_t resp_len;
	const char *cmd;
} ctx;

static void say_err(ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say_err(ctx *x, const char *fmt, ...)
{
	va_list ap;
	fprintf(x->err, "kmirror: %s: ", x->cmd);
	va_start(ap, fmt);
	vfprintf(x->err, fmt, ap);
	va_end(ap);
	fputc('\n', x->err);
}

/* The server's message, or the code's default one. */
static void message_of(int16_t code, km_str msg, char *buf, size_t len)
{
	if (msg.len >= 0)
		snprintf(buf, len, "%.*s", (int)msg.len, msg.p);
	else
		snprintf(buf, len, "%s", km_err_message(code));
	for (char *q = buf; *q; q++)
		if (*q == '\n' || *q == '\r')
			*q = ' ';
}

static void json_error(km_cli_json *j, int16_t code, km_str msg)
{
	char m[1024];
	if (code == 0) {
		km_cli_json_null(j);
		return;
	}
	message_of(code, msg, m, sizeof(m));
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
static int top_error(ctx *x, int16_t code, km_str msg)
{
	char m[1024];
	message_of(code, msg, m, sizeof(m));
	say_err(x, "%s: %s", km_err_name(code), m);
	if (x->a->json) {
		km_cli_json j;
		km_cli_json_init(&j, x->out);
		km_cli_json_obj(&j);
		km_cli_json_key(&j, "error");
		json_error(&j, code, msg);
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

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * Send w (checked) as api_key at the negotiated version; on success r reads the response body.
 * While kmirrord is still reading __mirror_state back it answers COORDINATOR_LOAD_IN_PROGRESS,
 * having done nothing: the request is sent again until --timeout-ms, as Kafka's tools retry.
 */
static bool call(ctx *x, int16_t api_key, km_wr *w, int16_t version, km_rd *r)
{
	int64_t deadline = now_ms() + x->a->timeout_ms;
	char why[512];
	km_err rc;

	if (!km_wr_ok(w)) {
		say_err(x, "cannot encode the request: %s", km_err_name(w->err));
		km_wr_free(w);
		return false;
	}
	for (;;) {
		free(x->resp);
		x->resp = NULL;
		rc = km_cli_call(x->cc, api_key, version, w->buf, w->len, &x->resp, &x->resp_len, why, sizeof(why));
		if (rc != KM_OK || mirror_top_error(api_key, x->resp, x->resp_len) != KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS ||
		    now_ms() + RETRY_BACKOFF_MS > deadline)
			break;
		nanosleep(&(struct timespec){0, RETRY_BACKOFF_MS * 1000000L}, NULL);
	}
	km_wr_free(w);
	if (rc != KM_OK) {
		say_err(x, "%s", why);
		return false;
	}
	km_rd_init(r, x->resp, x->resp_len);
	return true;
}

static bool decoded(ctx *x, km_err rc, int16_t api_key, int16_t version, const km_rd *r)
{
	char why[256];
	if (rc == KM_OK)
		return true;
	km_codec_strerror(why, sizeof(why), api_key, version, r);
	say_err(x, "malformed response: %s", why);
	return false;
}

/* The version of a mirror RPC kmirrord offers (every one is v0 today), or -1 with an error said. */
static int16_t version_of(ctx *x, int16_t api_key)
{
	int16_t v = km_cli_conn_version(x->cc, api_key);
	if (v < 0)
		say_err(x, "kmirrord does not offer this command's RPC (api key %d): it is older than this kmirror",
			api_key);
	return v;
}

/* ---- create, alter, delete ---- */

static int cmd_create(ctx *x)
{
	const km_cli_args *a = x->a;
	int16_t v = version_of(x, KM_API_CREATE_MIRROR);
	km_create_mirror_request m;
	km_create_mirror_request_mirror_config *cfg;
	km_create_mirror_response resp;
	km_wr w;
	km_rd r;

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
	km_wr_init(&w);
	km_create_mirror_request_encode(&w, v, &m);
	if (!call(x, KM_API_CREATE_MIRROR, &w, v, &r))
		return KM_CLI_EXIT_ERROR;
	km_create_mirror_response_init(&resp);
	if (!decoded(x, km_create_mirror_response_decode(&r, v, &resp, &x->arena), KM_API_CREATE_MIRROR, v, &r))
		return KM_CLI_EXIT_ERROR;
	if (resp.error_code)
		return top_error(x, resp.error_code, resp.error_message);
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
	int16_t v = version_of(x, KM_API_ALTER_MIRROR);
	km_alter_mirror_request m;
	km_alter_mirror_request_mirror_config *cfg;
	km_alter_mirror_response resp;
	km_wr w;
	km_rd r;

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
	km_wr_init(&w);
	km_alter_mirror_request_encode(&w, v, &m);
	if (!call(x, KM_API_ALTER_MIRROR, &w, v, &r))
		return KM_CLI_EXIT_ERROR;
	km_alter_mirror_response_init(&resp);
	if (!decoded(x, km_alter_mirror_response_decode(&r, v, &resp, &x->arena), KM_API_ALTER_MIRROR, v, &r))
		return KM_CLI_EXIT_ERROR;
	if (resp.error_code)
		return top_error(x, resp.error_code, resp.error_message);
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
	int16_t v = version_of(x, KM_API_DELETE_MIRROR);
	km_delete_mirror_request m;
	km_delete_mirror_response resp;
	km_wr w;
	km_rd r;

	if (v < 0)
		return KM_CLI_EXIT_ERROR;
	km_delete_mirror_request_init(&m);
	m.mirror_name = km_str_c(a->mirror);
	km_wr_init(&w);
	km_delete_mirror_request_encode(&w, v, &m);
	if (!call(x, KM_API_DELETE_MIRROR, &w, v, &r))
		return KM_CLI_EXIT_ERROR;
	km_delete_mirror_response_init(&resp);
	if (!decoded(x, km_delete_mirror_response_decode(&r, v, &resp, &x->arena), KM_API_DELETE_MIRROR, v, &r))
		return KM_CLI_EXIT_ERROR;
	if (resp.error_code)
		return top_error(x, resp.error_code, resp.error_message);
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

static int cmd_list(ctx *x)
{
	int16_t v = version_of(x, KM_API_LIST_MIRRORS);
	km_list_mirrors_request m;
	km_list_mirrors_response resp;
	km_wr w;
	km_rd r;

	if (v < 0)
		return KM_CLI_EXIT_ERROR;
	km_list_mirrors_request_init(&m);
	km_wr_init(&w);
	km_list_mirrors_request_encode(&w, v, &m);
	if (!call(x, KM_API_LIST_MIRRORS, &w, v, &r))
		return KM_CLI_EXIT_ERROR;
	km_list_mirrors_response_init(&resp);
	if (!decoded(x, km_list_mirrors_response_decode(&r, v, &resp, &x->arena), KM_API_LIST_MIRRORS, v, &r))
		return KM_CLI_EXIT_ERROR;
	if (resp.error_code)
		return top_error(x, resp.error_code, resp.error_message);
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
	}
	return KM_CLI_EXIT_OK;
}

/* ---- describe ---- */

/* DescribeMirrors of one mirror (or all when mirror is NULL), topics as given; resp decoded in x's arena. */
static bool describe_call(ctx *x, const char *mirror, char *const *topics, size_t ntopics,
			  km_describe_mirrors_response *resp)
{
	int16_t v = version_of(x, KM_API_DESCRIBE_MIRRORS);
	km_describe_mirrors_request m;
	km_str name, *ts = NULL;
	km_wr w;
	km_rd r;

	if (v < 0)
		return false;
	km_describe_mirrors_request_init(&m);
	if (mirror) {
		name = km_str_c(mirror);
		m.mirror_names.items = &name;
		m.mirror_names.count = 1;
	} else
		m.mirror_names.count = -1;
	if (topics) {
		ts = km_arena_calloc(&x->arena, (ntopics ? ntopics : 1) * sizeof(*ts));
		if (!ts)
			return false;
		for (size_t i = 0; i < ntopics; i++)
			ts[i] = km_str_c(topics[i]);
		m.topics.items = ts;
		m.topics.count = (int32_t)ntopics;
	} else
		m.topics.count = -1;
	km_wr_init(&w);
	km_describe_mirrors_request_encode(&w, v, &m);
	if (!call(x, KM_API_DESCRIBE_MIRRORS, &w, v, &r))
		return false;
	km_describe_mirrors_response_init(resp);
	return decoded(x, km_describe_mirrors_response_decode(&r, v, resp, &x->arena), KM_API_DESCRIBE_MIRRORS, v,
		       &r);
}

/* Kafka shows topic ids as URL-safe base64 without padding (22 characters). */
static void uuid_b64(const km_uuid *u, char out[23])
{
	static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
	size_t o = 0;
	for (size_t i = 0; i < 16; i += 3) {
		uint32_t n = (uint32_t)u->b[i] << 16 | (i + 1 < 16 ? (uint32_t)u->b[i + 1] << 8 : 0) |
			     (i + 2 < 16 ? u->b[i + 2] : 0);
		out[o++] = tab[n >> 18 & 63];
		out[o++] = tab[n >> 12 & 63];
		if (i + 1 < 16)
			out[o++] = tab[n >> 6 & 63];
		if (i + 2 < 16)
			out[o++] = tab[n & 63];
	}
	out[o] = 0;
}

/* A mirror's metadata sync in describe's JSON: "metadata_sync":[{...}, one per step]. */
static void json_sync(km_cli_json *j, const km_describe_mirrors_response_described_mirror *dm)
{
	km_cli_json_key(j, "metadata_sync");
	km_cli_json_arr(j);
	for (int32_t k = 0; k < dm->metadata_sync.count; k++) {
		const km_describe_mirrors_response_metadata_sync_status *ds = &dm->metadata_sync.items[k];
		km_cli_json_obj(j);
		km_cli_json_key(j, "kind");
		km_cli_json_strn(j, ds->kind.p, ds->kind.len);
		km_cli_json_key(j, "is_owner");
		km_cli_json_bool(j, ds->is_owner);
		km_cli_json_key(j, "last_sync_time_ms");
		km_cli_json_int(j, ds->last_sync_time_ms);
		km_cli_json_key(j, "compared");
		km_cli_json_int(j, ds->compared);
		km_cli_json_key(j, "changes_last_cycle");
		km_cli_json_int(j, ds->changes_last_cycle);
		km_cli_json_key(j, "changes_total");
		km_cli_json_int(j, ds->changes_total);
		km_cli_json_key(j, "skipped");
		km_cli_json_int(j, ds->skipped);
		km_cli_json_key(j, "errors_total");
		km_cli_json_int(j, ds->errors_total);
		km_cli_json_key(j, "last_error");
		km_cli_json_strn(j, ds->last_error.p, ds->last_error.len);
		km_cli_json_key(j, "last_error_time_ms");
		km_cli_json_int(j, ds->last_error_time_ms);
		km_cli_json_obj_end(j);
	}
	km_cli_json_arr_end(j);
}

static void json_describe(FILE *out, const km_describe_mirrors_response *resp)
{
	km_cli_json j;

	km_cli_json_init(&j, out);
	km_cli_json_obj(&j);
	km_cli_json_key(&j, "mirrors");
	km_cli_json_arr(&j);
	for (int32_t i = 0; i < resp->mirrors.count; i++) {
		const km_describe_mirrors_response_described_mirror *dm = &resp->mirrors.items[i];
		km_cli_json_obj(&j);
		km_cli_json_key(&j, "name");
		km_cli_json_strn(&j, dm->mirror_name.p, dm->mirror_name.len);
		km_cli_json_key(&j, "error");
		json_error(&j, dm->error_code, dm->error_message);
		km_cli_json_key(&j, "configs");
		km_cli_json_arr(&j);
		for (int32_t c = 0; c < dm->configs.count; c++) {
			const km_describe_mirrors_response_described_config *dc = &dm->configs.items[c];
			km_cli_json_obj(&j);
			km_cli_json_key(&j, "name");
			km_cli_json_strn(&j, dc->name.p, dc->name.len);
			km_cli_json_key(&j, "value");
			/* A secret is never printed, even if a server sent its value. */
			if (dc->is_sensitive)
				km_cli_json_null(&j);
			else
				km_cli_json_strn(&j, dc->value.p, dc->value.len);
			km_cli_json_key(&j, "sensitive");
			km_cli_json_bool(&j, dc->is_sensitive);
			km_cli_json_obj_end(&j);
		}
		km_cli_json_arr_end(&j);
		km_cli_json_key(&j, "topics");
		km_cli_json_arr(&j);
		for (int32_t t = 0; t < dm->topics.count; t++) {
			const km_describe_mirrors_response_described_topic *dt = &dm->topics.items[t];
			char id[23];
			km_cli_json_obj(&j);
			km_cli_json_key(&j, "name");
			km_cli_json_strn(&j, dt->name.p, dt->name.len);
			km_cli_json_key(&j, "topic_id");
			if (km_uuid_is_zero(&dt->topic_id))
				km_cli_json_null(&j);
			else {
				uuid_b64(&dt->topic_id, id);
				km_cli_json_str(&j, id);
			}
			km_cli_json_key(&j, "state");
			km_cli_json_strn(&j, dt->state.p, dt->state.len);
			km_cli_json_key(&j, "partitions");
			km_cli_json_arr(&j);
			for (int32_t p = 0; p < dt->partitions.count; p++) {
				const km_describe_mirrors_response_described_partition *dp = &dt->partitions.items[p];
				km_cli_json_obj(&j);
				km_cli_json_key(&j, "partition");
				km_cli_json_int(&j, dp->partition_index);
				km_cli_json_key(&j, "state");
				km_cli_json_strn(&j, dp->state.p, dp->state.len);
				km_cli_json_key(&j, "state_change_time_ms");
				km_cli_json_int(&j, dp->state_change_time_ms);
				km_cli_json_key(&j, "source_log_end_offset");
				km_cli_json_int(&j, dp->source_log_end_offset);
				km_cli_json_key(&j, "mirrored_offset");
				km_cli_json_int(&j, dp->mirrored_offset);
				km_cli_json_key(&j, "lag");
				km_cli_json_int(&j, dp->lag);
				km_cli_json_key(&j, "skipped_records");
				km_cli_json_int(&j, dp->skipped_records);
				km_cli_json_key(&j, "last_error");
				km_cli_json_strn(&j, dp->last_error.p, dp->last_error.len);
				km_cli_json_key(&j, "last_error_time_ms");
				km_cli_json_int(&j, dp->last_error_time_ms);
				km_cli_json_obj_end(&j);
			}
			km_cli_json_arr_end(&j);
			km_cli_json_obj_end(&j);
		}
		km_cli_json_arr_end(&j);
		json_sync(&j, dm);
		km_cli_json_obj_end(&j);
	}
	km_cli_json_arr_end(&j);
	km_cli_json_obj_end(&j);
}

static void num_or_dash(int64_t v, char *buf, size_t len)
{
	if (v < 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%lld", (long long)v);
}

/*
 * A mirror's metadata sync in describe's text: a heading that says whether this kmirrord runs it,
 * then one row per step. Nothing from a kmirrord that does not report it.
 */
static void table_sync(FILE *out, const km_describe_mirrors_response_described_mirror *dm)
{
	static const char *const hdr[] = {"KIND", "LAST-SYNC", "COMPARED", "CHANGES-LAST", "CHANGES-TOTAL", "SKIPPED",
					  "ERRORS", "LAST-ERROR"};
	bool owner = false;
	km_cli_table t;

	if (dm->metadata_sync.count <= 0)
		return;
	for (int32_t k = 0; k < dm->metadata_sync.count; k++)
		owner |= dm->metadata_sync.items[k].is_owner;
	if (!km_cli_table_init(&t, sizeof(hdr) / sizeof(hdr[0]), hdr))
		return;
	for (int32_t k = 0; k < dm->metadata_sync.count; k++) {
		const km_describe_mirrors_response_metadata_sync_status *ds = &dm->metadata_sync.items[k];
		char kind[64], last[32], cmp[24], chl[24], cht[24], skip[24], errs[24], le[1024];
		const char *row[] = {kind, last, cmp, chl, cht, skip, errs, le};
		snprintf(kind, sizeof(kind), "%.*s", (int)ds->kind.len, ds->kind.p);
		if (ds->last_sync_time_ms < 0)
			snprintf(last, sizeof(last), "never");
		else
			km_cli_format_time(ds->last_sync_time_ms, last, sizeof(last));
		snprintf(cmp, sizeof(cmp), "%lld", (long long)ds->compared);
		snprintf(chl, sizeof(chl), "%lld", (long long)ds->changes_last_cycle);
		snprintf(cht, sizeof(cht), "%lld", (long long)ds->changes_total);
		snprintf(skip, sizeof(skip), "%lld", (long long)ds->skipped);
		snprintf(errs, sizeof(errs), "%lld", (long long)ds->errors_total);
		if (ds->last_error.len < 0)
			snprintf(le, sizeof(le), "-");
		else {
			char at[32];
			km_cli_format_time(ds->last_error_time_ms, at, sizeof(at));
			snprintf(le, sizeof(le), "%.*s (%s)", (int)ds->last_error.len, ds->last_error.p, at);
		}
		km_cli_table_row(&t, row);
	}
	if (owner)
		fprintf(out, "Metadata sync:\n");
	else
		fprintf(out, "Metadata sync (not run by this kmirrord: another kmirrord runs it, or no topic is synced "
			     "yet):\n");
	km_cli_table_print(&t, out);
	km_cli_table_free(&t);
	fputc('\n', out);
}

static void table_describe(FILE *out, const km_describe_mirrors_response *resp)
{
	for (int32_t i = 0; i < resp->mirrors.count; i++) {
		const km_describe_mirrors_response_described_mirror *dm = &resp->mirrors.items[i];
		static const char *const chdr[] = {"CONFIG", "VALUE"};
		static const char *const phdr[] = {"TOPIC", "PARTITION", "STATE", "SINCE", "SOURCE-END", "MIRRORED", "LAG",
						   "SKIPPED", "LAST-ERROR"};
		km_cli_table ct, pt;

		if (i > 0)
			fputc('\n', out);
		fprintf(out, "Mirror: %.*s\n", (int)dm->mirror_name.len, dm->mirror_name.p);
		if (dm->error_code) {
			char m[1024];
			message_of(dm->error_code, dm->error_message, m, sizeof(m));
			fprintf(out, "Error: %s: %s\n", km_err_name(dm->error_code), m);
			continue;
		}
		if (!km_cli_table_init(&ct, sizeof(chdr) / sizeof(chdr[0]), chdr))
			return;
		for (int32_t c = 0; c < dm->configs.count; c++) {
			const km_describe_mirrors_response_described_config *dc = &dm->configs.items[c];
			char name[512], val[2048];
			const char *row[] = {name, val};
			snprintf(name, sizeof(name), "%.*s", (int)dc->name.len, dc->name.p);
			if (dc->is_sensitive)
				snprintf(val, sizeof(val), SECRET_SHOWN);
			else if (dc->value.len < 0)
				snprintf(val, sizeof(val), "-");
			else
				snprintf(val, sizeof(val), "%.*s", (int)dc->value.len, dc->value.p);
			km_cli_table_row(&ct, row);
		}
		km_cli_table_print(&ct, out);
		km_cli_table_free(&ct);
		fputc('\n', out);
		table_sync(out, dm);
		if (!km_cli_table_init(&pt, sizeof(phdr) / sizeof(phdr[0]), phdr))
			return;
		for (int32_t t = 0; t < dm->topics.count; t++) {
			const km_describe_mirrors_response_described_topic *dt = &dm->topics.items[t];
			char topic[512];
			snprintf(topic, sizeof(topic), "%.*s", (int)dt->name.len, dt->name.p);
			if (dt->partitions.count <= 0) {
				char st[64];
				const char *row[] = {topic, "-", st, "-", "-", "-", "-", "-", "-"};
				snprintf(st, sizeof(st), "%.*s", (int)dt->state.len, dt->state.p);
				km_cli_table_row(&pt, row);
			}
			for (int32_t p = 0; p < dt->partitions.count; p++) {
				const km_describe_mirrors_response_described_partition *dp = &dt->partitions.items[p];
				char part[16], st[64], since[32], end[24], mir[24], lag[24], skip[24], le[1024];
				const char *row[] = {topic, part, st, since, end, mir, lag, skip, le};
				snprintf(part, sizeof(part), "%d", dp->partition_index);
				snprintf(st, sizeof(st), "%.*s", (int)dp->state.len, dp->state.p);
				km_cli_format_time(dp->state_change_time_ms, since, sizeof(since));
				num_or_dash(dp->source_log_end_offset, end, sizeof(end));
				num_or_dash(dp->mirrored_offset, mir, sizeof(mir));
				num_or_dash(dp->lag, lag, sizeof(lag));
				snprintf(skip, sizeof(skip), "%lld", (long long)dp->skipped_records);
				if (dp->last_error.len < 0)
					snprintf(le, sizeof(le), "-");
				else {
					char at[32];
					km_cli_format_time(dp->last_error_time_ms, at, sizeof(at));
					snprintf(le, sizeof(le), "%.*s (%s)", (int)dp->last_error.len, dp->last_error.p, at);
				}
				km_cli_table_row(&pt, row);
			}
		}
		if (dm->topics.count <= 0)
			fprintf(out, "No topics.\n");
		else
			km_cli_table_print(&pt, out);
		km_cli_table_free(&pt);
	}
}

void km_cli_describe_print(FILE *out, const km_describe_mirrors_response *resp, bool json)
{
	if (json)
		json_describe(out, resp);
	else
		table_describe(out, resp);
}

static int cmd_describe(ctx *x)
{
	km_describe_mirrors_response resp;
	int rc = KM_CLI_EXIT_OK;

	if (!describe_call(x, x->a->mirror, x->a->topics, x->a->ntopics, &resp))
		return KM_CLI_EXIT_ERROR;
	if (resp.error_code)
		return top_error(x, resp.error_code, resp.error_message);
	/* A mirror's own error (an unknown name) fails the command; the others still print. */
	for (int32_t i = 0; i < resp.mirrors.count; i++) {
		const km_describe_mirrors_response_described_mirror *dm = &resp.mirrors.items[i];
		if (dm->error_code && rc == KM_CLI_EXIT_OK) {
			char m[1024];
			message_of(dm->error_code, dm->error_message, m, sizeof(m));
			say_err(x, "%s: %s", km_err_name(dm->error_code), m);
			rc = KM_CLI_EXIT_ERROR;
		}
	}
	if (resp.mirrors.count == 0 && !x->a->mirror && !x->a->json)
		fprintf(x->out, "No mirrors.\n");
	else
		km_cli_describe_print(x->out, &resp, x->a->json);
	return rc;
}

/* ---- start, stop, pause, resume ---- */

/* One topic's result, whichever RPC it came from. */
typedef struct topic_result {
	km_str name;
	int16_t error_code;
	km_str error_message;
} topic_result;

/* Build the request of one of the four topic RPCs (the same layout, four generated types). */
#define BUILD_TOPICS_REQUEST(prefix, w, v, mirror, names, n)                                           \
	do {                                                                                           \
		prefix##_request m_;                                                                   \
		prefix##_request_topic_data *td_ = km_arena_calloc(&x->arena, ((n) ? (n) : 1) * sizeof(*td_)); \
		if (!td_)                                                                              \
			return KM_CLI_EXIT_ERROR;                                                      \
		prefix##_request_init(&m_);                                                            \
		m_.mirror_name = km_str_c(mirror);                                                     \
		for (size_t i_ = 0; i_ < (n); i_++) {                                                  \
			prefix##_request_topic_data_init(&td_[i_]);                                    \
			td_[i_].name = km_str_c((names)[i_]);                                          \
		}                                                                                      \
		m_.topics.items = td_;                                                                 \
		m_.topics.count = (int32_t)(n);                                                        \
		prefix##_request_encode(w, v, &m_);                                                    \
	} while (0)

/* Decode its response into top-level error and results (in the arena). */
#define DECODE_TOPICS_RESPONSE(prefix, key, r, v, ec, em, res, nres)                                  \
	do {                                                                                           \
		prefix##_response m_;                                                                  \
		prefix##_response_init(&m_);                                                           \
		if (!decoded(x, prefix##_response_decode(r, v, &m_, &x->arena), key, v, r))            \
			return KM_CLI_EXIT_ERROR;                                                      \
		ec = m_.error_code;                                                                    \
		em = m_.error_message;                                                                 \
		nres = m_.topics.count > 0 ? (size_t)m_.topics.count : 0;                              \
		res = km_arena_calloc(&x->arena, (nres ? nres : 1) * sizeof(*res));                    \
		if (!res)                                                                              \
			return KM_CLI_EXIT_ERROR;                                                      \
		for (size_t i_ = 0; i_ < nres; i_++) {                                                 \
			res[i_].name = m_.topics.items[i_].name;                                       \
			res[i_].error_code = m_.topics.items[i_].error_code;                           \
			res[i_].error_message = m_.topics.items[i_].error_message;                     \
		}                                                                                      \
	} while (0)

/* Whole-name match of re over the names; the matches go into *out (arena strings). */
static bool regex_select(ctx *x, const char *re, km_str *names, size_t n, char ***out, size_t *nout)
{
	regex_t rx;
	char *anchored = km_arena_alloc(&x->arena, strlen(re) + 5);
	char errbuf[256];
	int rc;

	*out = km_arena_calloc(&x->arena, (n ? n : 1) * sizeof(char *));
	*nout = 0;
	if (!anchored || !*out)
		return false;
	sprintf(anchored, "^(%s)$", re);
	rc = regcomp(&rx, anchored, REG_EXTENDED | REG_NOSUB);
	if (rc != 0) {
		regerror(rc, &rx, errbuf, sizeof(errbuf));
		say_err(x, "--topics-regex '%s': %s", re, errbuf);
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		char *s = km_arena_alloc(&x->arena, (size_t)(names[i].len > 0 ? names[i].len : 0) + 1);
		if (!s)
			break;
		memcpy(s, names[i].p, (size_t)(names[i].len > 0 ? names[i].len : 0));
		s[names[i].len > 0 ? names[i].len : 0] = 0;
		if (regexec(&rx, s, 0, NULL, 0) == 0)
			(*out)[(*nout)++] = s;
	}
	regfree(&rx);
	return true;
}

/* The destination's topics (a Metadata request that kmirrord forwards), for start --topics-regex. */
static bool destination_topics(ctx *x, km_str **names, size_t *n)
{
	int16_t v = km_cli_conn_version(x->cc, KM_API_METADATA);
	km_metadata_request m;
	km_metadata_response resp;
	km_wr w;
	km_rd r;

	if (v < 1) {
		say_err(x, "kmirrord does not offer Metadata v1 or later");
		return false;
	}
	km_metadata_request_init(&m);
	m.topics.count = -1; /* all topics */
	m.allow_auto_topic_creation = false;
	km_wr_init(&w);
	km_metadata_request_encode(&w, v, &m);
	if (!call(x, KM_API_METADATA, &w, v, &r))
		return false;
	km_metadata_response_init(&resp);
	if (!decoded(x, km_metadata_response_decode(&r, v, &resp, &x->arena), KM_API_METADATA, v, &r))
		return false;
	*names = km_arena_calloc(&x->arena, (resp.topics.count > 0 ? (size_t)resp.topics.count : 1) * sizeof(km_str));
	*n = 0;
	if (!*names)
		return false;
	for (int32_t i = 0; i < resp.topics.count; i++) {
		const km_metadata_response_topic *t = &resp.topics.items[i];
		/* Internal topics and kmirror's own state are never mirror targets. */
		if (t->error_code || t->is_internal || t->name.len < 0 || km_str_eq_c(t->name, MIRROR_STATE_TOPIC))
			continue;
		(*names)[(*n)++] = t->name;
	}
	return true;
}

/* The mirror's topics (DescribeMirrors), for stop/pause/resume --topics-regex. */
/* The mirror of --mirror described (its topics, or only these): *dm, or an exit code from an error said. */
static int describe_one(ctx *x, char *const *topics, size_t ntopics, km_describe_mirrors_response *resp,
			const km_describe_mirrors_response_described_mirror **dm)
{
	if (!describe_call(x, x->a->mirror, topics, ntopics, resp))
		return KM_CLI_EXIT_ERROR;
	if (resp->error_code)
		return top_error(x, resp->error_code, resp->error_message);
	if (resp->mirrors.count < 1) {
		say_err(x, "UNKNOWN_CLUSTER_MIRROR: no mirror named %s", x->a->mirror);
		return KM_CLI_EXIT_ERROR;
	}
	*dm = &resp->mirrors.items[0];
	if ((*dm)->error_code)
		return top_error(x, (*dm)->error_code, (*dm)->error_message);
	return KM_CLI_EXIT_OK;
}

static int mirror_topics(ctx *x, km_str **names, size_t *n)
{
	km_describe_mirrors_response resp;
	const km_describe_mirrors_response_described_mirror *dm;
	int rc = describe_one(x, NULL, 0, &resp, &dm);

	if (rc != KM_CLI_EXIT_OK)
		return rc;
	*names = km_arena_calloc(&x->arena, (dm->topics.count > 0 ? (size_t)dm->topics.count : 1) * sizeof(km_str));
	if (!*names)
		return KM_CLI_EXIT_ERROR;
	*n = 0;
	for (int32_t i = 0; i < dm->topics.count; i++)
		(*names)[(*n)++] = dm->topics.items[i].name;
	return KM_CLI_EXIT_OK;
}

/*
 * Where a stop now leaves the partition: the mirrored offset, or the start of the earliest open
 * transaction (a stop aborts it and hides what it holds).
 */
static int64_t stop_point_of(const km_describe_mirrors_response_described_partition *dp)
{
	return dp->open_transaction_offset >= 0 && dp->open_transaction_offset < dp->mirrored_offset
		       ? dp->open_transaction_offset
		       : dp->mirrored_offset;
}

/* The records in open transactions a stop now would abort. */
static int64_t in_txn_of(const km_describe_mirrors_response_described_partition *dp)
{
	return dp->mirrored_offset < 0 ? -1 : dp->mirrored_offset - stop_point_of(dp);
}

/* The records at risk of one partition if it stopped now: -1 when either end is unknown. */
static int64_t at_risk_of(const km_describe_mirrors_response_described_partition *dp)
{
	int64_t at = stop_point_of(dp);
	if (dp->source_log_end_offset < 0 || at < 0)
		return -1;
	return dp->source_log_end_offset > at ? dp->source_log_end_offset - at : 0;
}

static const char dry_run_note_end[] =
	"SOURCE-END is the source's end offset as kmirrord last fetched it: records written to the source "
	"after that fetch are not counted.";
static const char dry_run_note_txn[] =
	"IN-TXN records are mirrored inside transactions the source has not decided as far as mirrored: a "
	"stop aborts them, and they count as at risk.";

/*
 * stop --dry-run: what a stop now would leave behind, from one DescribeMirrors and nothing else (no
 * state changes). The source end is the pipeline's last fetched high watermark; kmirror does not ask
 * the source itself (it may be the cluster that is gone).
 */
static int cmd_stop_dry_run(ctx *x)
{
	const km_cli_args *a = x->a;
	km_describe_mirrors_response resp;
	const km_describe_mirrors_response_described_mirror *dm;
	bool *seen = NULL, *sel;
	char **matched = NULL;
	int64_t total = 0;
	size_t nparts = 0, unknown = 0, missing = 0, nmatched = 0, nt;
	int rc = describe_one(x, a->topics, a->ntopics, &resp, &dm);

	if (rc != KM_CLI_EXIT_OK)
		return rc;
	nt = dm->topics.count > 0 ? (size_t)dm->topics.count : 0;
	sel = km_arena_calloc(&x->arena, (nt ? nt : 1) * sizeof(*sel));
	if (a->topics)
		seen = km_arena_calloc(&x->arena, (a->ntopics ? a->ntopics : 1) * sizeof(*seen));
	if (!sel || (a->topics && !seen))
		return KM_CLI_EXIT_ERROR;
	if (a->topics_regex) {
		km_str *names = km_arena_calloc(&x->arena, (nt ? nt : 1) * sizeof(*names));
		if (!names)
			return KM_CLI_EXIT_ERROR;
		for (size_t t = 0; t < nt; t++)
			names[t] = dm->topics.items[t].name;
		if (!regex_select(x, a->topics_regex, names, nt, &matched, &nmatched))
			return KM_CLI_EXIT_ERROR;
	}
	for (int32_t t = 0; t < dm->topics.count; t++) {
		const km_describe_mirrors_response_described_topic *dt = &dm->topics.items[t];

		sel[t] = !a->topics_regex;
		for (size_t i = 0; i < nmatched && !sel[t]; i++)
			sel[t] = km_str_eq_c(dt->name, matched[i]);
		for (size_t i = 0; a->topics && i < a->ntopics; i++)
			if (km_str_eq_c(dt->name, a->topics[i]))
				seen[i] = true;
		if (!sel[t])
			continue;
		for (int32_t p = 0; p < dt->partitions.count; p++) {
			int64_t r = at_risk_of(&dt->partitions.items[p]);
			/* A STOPPED partition is writable already: a stop would not touch it. */
			if (km_str_eq_c(dt->partitions.items[p].state, "STOPPED"))
				continue;
			nparts++;
			if (r < 0)
				unknown++;
			else
				total += r;
		}
	}
	/* A topic stop would refuse is named, as stop names it; the others are still reported. */
	for (size_t i = 0; a->topics && i < a->ntopics; i++)
		if (!seen[i] && missing++ == 0) {
			say_err(x, "%s: topic %s is not in mirror %s", km_err_name(KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR),
				a->topics[i], a->mirror);
			rc = KM_CLI_EXIT_ERROR;
		}
	if (a->topics_regex && !nmatched) {
		say_err(x, "no mirror topic matches --topics-regex '%s'", a->topics_regex);
		return KM_CLI_EXIT_ERROR;
	}
	if (a->json) {
		km_cli_json j;
		km_cli_json_init(&j, x->out);
		km_cli_json_obj(&j);
		km_cli_json_key(&j, "mirror");
		km_cli_json_str(&j, a->mirror);
		km_cli_json_key(&j, "operation");
		km_cli_json_str(&j, km_cli_cmd_name(a->cmd));
		km_cli_json_key(&j, "dry_run");
		km_cli_json_bool(&j, true);
		km_cli_json_key(&j, "topics");
		km_cli_json_arr(&j);
		for (int32_t t = 0; t < dm->topics.count; t++) {
			const km_describe_mirrors_response_described_topic *dt = &dm->topics.items[t];
			if (!sel[t])
				continue;
			km_cli_json_obj(&j);
			km_cli_json_key(&j, "name");
			km_cli_json_strn(&j, dt->name.p, dt->name.len);
			km_cli_json_key(&j, "error");
			km_cli_json_null(&j);
			km_cli_json_key(&j, "state");
			km_cli_json_strn(&j, dt->state.p, dt->state.len);
			km_cli_json_key(&j, "partitions");
			km_cli_json_arr(&j);
			for (int32_t p = 0; p < dt->partitions.count; p++) {
				const km_describe_mirrors_response_described_partition *dp = &dt->partitions.items[p];
				bool stopped = km_str_eq_c(dp->state, "STOPPED");
				km_cli_json_obj(&j);
				km_cli_json_key(&j, "partition");
				km_cli_json_int(&j, dp->partition_index);
				km_cli_json_key(&j, "state");
				km_cli_json_strn(&j, dp->state.p, dp->state.len);
				km_cli_json_key(&j, "mirrored_offset");
				km_cli_json_int(&j, dp->mirrored_offset);
				km_cli_json_key(&j, "source_end_offset");
				km_cli_json_int(&j, dp->source_log_end_offset);
				km_cli_json_key(&j, "records_in_open_transactions");
				km_cli_json_int(&j, stopped ? -1 : in_txn_of(dp));
				km_cli_json_key(&j, "records_at_risk");
				km_cli_json_int(&j, stopped ? -1 : at_risk_of(dp));
				km_cli_json_obj_end(&j);
			}
			km_cli_json_arr_end(&j);
			km_cli_json_obj_end(&j);
		}
		/* Names stop would refuse, with the error it would give. */
		for (size_t i = 0; a->topics && i < a->ntopics; i++) {
			char m[600];
			if (seen[i])
				continue;
			snprintf(m, sizeof(m), "topic %s is not in mirror %s", a->topics[i], a->mirror);
			km_cli_json_obj(&j);
			km_cli_json_key(&j, "name");
			km_cli_json_str(&j, a->topics[i]);
			km_cli_json_key(&j, "error");
			json_error(&j, KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR, km_str_c(m));
			km_cli_json_key(&j, "state");
			km_cli_json_null(&j);
			km_cli_json_key(&j, "partitions");
			km_cli_json_arr(&j);
			km_cli_json_arr_end(&j);
			km_cli_json_obj_end(&j);
		}
		km_cli_json_arr_end(&j);
		km_cli_json_key(&j, "partitions");
		km_cli_json_int(&j, (int64_t)nparts);
		km_cli_json_key(&j, "partitions_unknown");
		km_cli_json_int(&j, (int64_t)unknown);
		km_cli_json_key(&j, "total_records_at_risk");
		km_cli_json_int(&j, total);
		km_cli_json_key(&j, "notes");
		km_cli_json_arr(&j);
		km_cli_json_str(&j, dry_run_note_end);
		km_cli_json_str(&j, dry_run_note_txn);
		km_cli_json_arr_end(&j);
		km_cli_json_obj_end(&j);
	} else {
		static const char *const hdr[] = {"TOPIC", "PARTITION", "STATE", "MIRRORED", "SOURCE-END", "IN-TXN",
						  "AT-RISK"};
		km_cli_table tb;
		if (!km_cli_table_init(&tb, sizeof(hdr) / sizeof(hdr[0]), hdr))
			return KM_CLI_EXIT_ERROR;
		for (int32_t t = 0; t < dm->topics.count; t++) {
			const km_describe_mirrors_response_described_topic *dt = &dm->topics.items[t];
			char topic[512];
			if (!sel[t])
				continue;
			snprintf(topic, sizeof(topic), "%.*s", (int)dt->name.len, dt->name.p);
			for (int32_t p = 0; p < dt->partitions.count; p++) {
				const km_describe_mirrors_response_described_partition *dp = &dt->partitions.items[p];
				char part[16], st[64], mir[24], end[24], txn[24], risk[24];
				const char *row[] = {topic, part, st, mir, end, txn, risk};
				int64_t r = at_risk_of(dp);
				snprintf(part, sizeof(part), "%d", dp->partition_index);
				snprintf(st, sizeof(st), "%.*s", (int)dp->state.len, dp->state.p);
				num_or_dash(dp->mirrored_offset, mir, sizeof(mir));
				num_or_dash(dp->source_log_end_offset, end, sizeof(end));
				num_or_dash(km_str_eq_c(dp->state, "STOPPED") ? -1 : in_txn_of(dp), txn, sizeof(txn));
				if (km_str_eq_c(dp->state, "STOPPED"))
					snprintf(risk, sizeof(risk), "-");
				else if (r < 0)
					snprintf(risk, sizeof(risk), "?");
				else
					snprintf(risk, sizeof(risk), "%lld", (long long)r);
				km_cli_table_row(&tb, row);
			}
		}
		km_cli_table_print(&tb, x->out);
		km_cli_table_free(&tb);
		fprintf(x->out, "\nTotal: %lld records at risk in %zu partitions", (long long)total, nparts);
		if (unknown)
			fprintf(x->out, " (%zu more unknown: ?)", unknown);
		fprintf(x->out, ". Dry run: nothing was stopped.\n%s\n%s\n", dry_run_note_end, dry_run_note_txn);
	}
	return rc;
}

/*
 * promote: wait until every partition of topics that a stop would touch has nothing left to
 * mirror (lag 0 as kmirrord last fetched the source, no transaction open in it), printing what is
 * behind every few seconds; refuse, naming the partitions behind, after --wait-ms.
 */
static int wait_zero_lag(ctx *x, char *const *topics, size_t ntopics)
{
	const km_cli_args *a = x->a;
	struct timespec t0, now;
	int64_t waited = 0, said = -1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		km_describe_mirrors_response resp;
		const km_describe_mirrors_response_described_mirror *dm;
		char behind[1024] = "";
		size_t nbehind = 0, len = 0;
		int64_t records = 0;
		km_arena keep = x->arena; /* each round's answer in an arena of its own */
		int rc;

		km_arena_init(&x->arena, ARENA_CAP);
		if ((rc = describe_one(x, topics, ntopics, &resp, &dm)) != KM_CLI_EXIT_OK) {
			km_arena_free(&x->arena);
			x->arena = keep;
			return rc;
		}
		for (int32_t t = 0; t < dm->topics.count; t++) {
			const km_describe_mirrors_response_described_topic *dt = &dm->topics.items[t];
			for (int32_t p = 0; p < dt->partitions.count; p++) {
				const km_describe_mirrors_response_described_partition *dp = &dt->partitions.items[p];
				int64_t risk = at_risk_of(dp), txn = in_txn_of(dp);
				if (km_str_eq_c(dp->state, "STOPPED") || (risk == 0 && txn <= 0))
					continue;
				nbehind++;
				records += risk > 0 ? risk : 0;
				if (len < sizeof(behind) - 1) {
					char what[64];
					if (risk < 0)
						snprintf(what, sizeof(what), "lag not known yet");
					else
						snprintf(what, sizeof(what), "%lld behind%s", (long long)risk,
							 txn > 0 ? ", a transaction open" : "");
					len += (size_t)snprintf(behind + len, sizeof(behind) - len, "%s%.*s-%d (%s)",
								nbehind > 1 ? ", " : "", (int)dt->name.len, dt->name.p,
								dp->partition_index, what);
					if (len >= sizeof(behind))
						len = sizeof(behind) - 1;
				}
			}
		}
		km_arena_free(&x->arena);
		x->arena = keep;
		if (!nbehind)
			return KM_CLI_EXIT_OK;
		clock_gettime(CLOCK_MONOTONIC, &now);
		waited = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
		if (waited >= a->wait_ms) {
			say_err(x, "promote refused: %zu partition(s) still behind after %lld ms (%lld records): %s; nothing "
				"was stopped (stop fails over at once, promote --wait-ms waits longer)", nbehind,
				(long long)waited, (long long)records, behind);
			return KM_CLI_EXIT_ERROR;
		}
		if (said < 0 || waited - said >= 5000) {
			said = waited;
			fprintf(stderr, "kmirror: promote: waiting for %zu partition(s), %lld records behind: %s\n", nbehind,
				(long long)records, behind);
		}
		nanosleep(&(struct timespec){0, 500 * 1000000L}, NULL);
	}
}

static km_cli_conn *open_conn(const km_cli_args *a, const char *bootstrap, FILE *errf, int *rc);

/*
 * start --dry-run: what a start would do with each partition. The mirror's source is asked
 * LastMirroredOffsets (reached with --command-config's settings); where it is a kmirrord that
 * mirrored the topic from here and stopped at M, the start keeps what is here below M and hides
 * the rest (ListOffsets here gives the end); elsewhere it mirrors from scratch.
 */
static int cmd_start_dry_run(ctx *x, char *const *topics, size_t ntopics)
{
	const km_cli_args *a = x->a;
	km_describe_mirrors_response resp;
	const km_describe_mirrors_response_described_mirror *dm;
	km_last_mirrored_offsets_response lr;
	km_list_offsets_response lo;
	ctx y = *x;
	char source[1024] = "";
	int rc = describe_one(x, NULL, 0, &resp, &dm);
	int16_t v, lv;
	int64_t total = 0;
	km_wr w;
	km_rd r;

	if (rc != KM_CLI_EXIT_OK)
		return rc;
	for (int32_t i = 0; i < dm->configs.count; i++)
		if (km_str_eq_c(dm->configs.items[i].name, "bootstrap.servers") && dm->configs.items[i].value.len > 0)
			snprintf(source, sizeof(source), "%.*s", (int)dm->configs.items[i].value.len,
				 dm->configs.items[i].value.p);
	if (!*source) {
		say_err(x, "mirror %s has no bootstrap.servers", a->mirror);
		return KM_CLI_EXIT_ERROR;
	}
	y.resp = NULL;
	y.resp_len = 0;
	if (!(y.cc = open_conn(a, source, x->err, &rc)))
		return rc;
	km_last_mirrored_offsets_response_init(&lr);
	lr.topics.count = 0;
	if ((v = km_cli_conn_version(y.cc, KM_API_LAST_MIRRORED_OFFSETS)) >= 0) {
		km_last_mirrored_offsets_request m;
		km_last_mirrored_offsets_request_topic_data *td = km_arena_calloc(&x->arena, (ntopics + 1) * sizeof(*td));
		if (!td)
			goto fail;
		km_last_mirrored_offsets_request_init(&m);
		m.mirror_name = km_str_c("");
		for (size_t i = 0; i < ntopics; i++) {
			km_last_mirrored_offsets_request_topic_data_init(&td[i]);
			td[i].name = km_str_c(topics[i]);
			td[i].partitions.count = -1;
		}
		m.topics.items = td;
		m.topics.count = (int32_t)ntopics;
		km_wr_init(&w);
		km_last_mirrored_offsets_request_encode(&w, v, &m);
		if (!call(&y, KM_API_LAST_MIRRORED_OFFSETS, &w, v, &r) ||
		    !decoded(&y, km_last_mirrored_offsets_response_decode(&r, v, &lr, &x->arena),
			     KM_API_LAST_MIRRORED_OFFSETS, v, &r))
			goto fail;
	}
	/* The ends here of every partition the source's kmirrord reported. */
	km_list_offsets_response_init(&lo);
	lo.topics.count = 0;
	if ((lv = km_cli_conn_version(x->cc, KM_API_LIST_OFFSETS)) >= 1 && lr.topics.count > 0) {
		km_list_offsets_request m;
		km_list_offsets_request_list_offsets_topic *lt = km_arena_calloc(&x->arena, (size_t)lr.topics.count * sizeof(*lt));
		int32_t nt = 0;
		if (!lt)
			goto fail;
		km_list_offsets_request_init(&m);
		m.replica_id = -1;
		for (int32_t t = 0; t < lr.topics.count; t++) {
			const km_last_mirrored_offsets_response_topic_result *tr = &lr.topics.items[t];
			km_list_offsets_request_list_offsets_partition *lp;
			if (tr->error_code || tr->partitions.count <= 0)
				continue;
			if (!(lp = km_arena_calloc(&x->arena, (size_t)tr->partitions.count * sizeof(*lp))))
				goto fail;
			km_list_offsets_request_list_offsets_topic_init(&lt[nt]);
			lt[nt].name = tr->name;
			for (int32_t k = 0; k < tr->partitions.count; k++) {
				km_list_offsets_request_list_offsets_partition_init(&lp[k]);
				lp[k].partition_index = tr->partitions.items[k].partition_index;
				lp[k].current_leader_epoch = -1;
				lp[k].timestamp = -1;
			}
			lt[nt].partitions.items = lp;
			lt[nt].partitions.count = tr->partitions.count;
			nt++;
		}
		m.topics.items = lt;
		m.topics.count = nt;
		if (nt) {
			km_wr_init(&w);
			km_list_offsets_request_encode(&w, lv, &m);
			if (!call(x, KM_API_LIST_OFFSETS, &w, lv, &r) ||
			    !decoded(x, km_list_offsets_response_decode(&r, lv, &lo, &x->arena), KM_API_LIST_OFFSETS, lv, &r))
				goto fail;
		}
	}
	{
		static const char *const hdr[] = {"TOPIC", "PARTITION", "START", "SOURCE-STOPPED-AT", "END-HERE", "HIDDEN"};
		km_cli_table tb;
		km_cli_json j;
		if (a->json) {
			km_cli_json_init(&j, x->out);
			km_cli_json_obj(&j);
			km_cli_json_key(&j, "mirror");
			km_cli_json_str(&j, a->mirror);
			km_cli_json_key(&j, "operation");
			km_cli_json_str(&j, "start");
			km_cli_json_key(&j, "dry_run");
			km_cli_json_bool(&j, true);
			km_cli_json_key(&j, "topics");
			km_cli_json_arr(&j);
		} else if (!km_cli_table_init(&tb, sizeof(hdr) / sizeof(hdr[0]), hdr)) {
			goto fail;
		}
		for (size_t i = 0; i < ntopics; i++) {
			const km_last_mirrored_offsets_response_topic_result *tr = NULL;
			for (int32_t t = 0; t < lr.topics.count && !tr; t++)
				if (km_str_eq_c(lr.topics.items[t].name, topics[i]) && !lr.topics.items[t].error_code)
					tr = &lr.topics.items[t];
			if (a->json) {
				km_cli_json_obj(&j);
				km_cli_json_key(&j, "name");
				km_cli_json_str(&j, topics[i]);
				km_cli_json_key(&j, "failback");
				km_cli_json_bool(&j, tr != NULL);
				km_cli_json_key(&j, "partitions");
				km_cli_json_arr(&j);
			} else if (!tr) {
				const char *row[] = {topics[i], "*", "from scratch", "-", "-", "all"};
				km_cli_table_row(&tb, row);
			}
			for (int32_t k = 0; tr && k < tr->partitions.count; k++) {
				const km_last_mirrored_offsets_response_partition_result *pr = &tr->partitions.items[k];
				int64_t end = -1, keep, hidden = -1;
				bool stopped = km_str_eq_c(pr->state, "STOPPED") && pr->last_mirrored_offset >= 0;
				for (int32_t t = 0; t < lo.topics.count; t++)
					if (km_str_eq_c(lo.topics.items[t].name, topics[i]))
						for (int32_t q = 0; q < lo.topics.items[t].partitions.count; q++)
							if (lo.topics.items[t].partitions.items[q].partition_index == pr->partition_index &&
							    !lo.topics.items[t].partitions.items[q].error_code)
								end = lo.topics.items[t].partitions.items[q].offset;
				keep = pr->last_mirrored_offset < end ? pr->last_mirrored_offset : end;
				if (stopped && end >= 0) {
					hidden = end - keep;
					total += hidden;
				}
				if (a->json) {
					km_cli_json_obj(&j);
					km_cli_json_key(&j, "partition");
					km_cli_json_int(&j, pr->partition_index);
					km_cli_json_key(&j, "source_state");
					km_cli_json_strn(&j, pr->state.p, pr->state.len);
					km_cli_json_key(&j, "source_stopped_at");
					km_cli_json_int(&j, pr->last_mirrored_offset);
					km_cli_json_key(&j, "end_here");
					km_cli_json_int(&j, end);
					km_cli_json_key(&j, "records_hidden");
					km_cli_json_int(&j, hidden);
					km_cli_json_obj_end(&j);
				} else {
					char part[16], at[24], e[24], h[24], st[64];
					const char *row[] = {topics[i], part, st, at, e, h};
					snprintf(part, sizeof(part), "%d", pr->partition_index);
					snprintf(st, sizeof(st), stopped ? "failback" : "refused (%.*s there)", (int)pr->state.len,
						 pr->state.p);
					num_or_dash(pr->last_mirrored_offset, at, sizeof(at));
					num_or_dash(end, e, sizeof(e));
					num_or_dash(hidden, h, sizeof(h));
					km_cli_table_row(&tb, row);
				}
			}
			if (a->json) {
				km_cli_json_arr_end(&j);
				km_cli_json_obj_end(&j);
			}
		}
		if (a->json) {
			km_cli_json_arr_end(&j);
			km_cli_json_key(&j, "total_records_hidden");
			km_cli_json_int(&j, total);
			km_cli_json_obj_end(&j);
		} else {
			km_cli_table_print(&tb, x->out);
			km_cli_table_free(&tb);
			fprintf(x->out, "\nTotal: %lld records here would be hidden (the divergent tail). Dry run: nothing "
				"was started.\nA failback keeps what is here below where the source's kmirrord stopped and "
				"mirrors from there; from scratch hides everything here. The start compares the record "
				"before the stop point on both sides, and refuses a topic not mirrored from here.\n",
				(long long)total);
		}
	}
	free(y.resp);
	km_cli_conn_free(y.cc);
	return KM_CLI_EXIT_OK;
fail:
	free(y.resp);
	km_cli_conn_free(y.cc);
	return KM_CLI_EXIT_ERROR;
}

static int cmd_topics(ctx *x)
{
	const km_cli_args *a = x->a;
	int16_t key, v, ec = 0;
	char *const *topics = a->topics;
	size_t ntopics = a->ntopics, nres = 0, failed = 0;
	topic_result *res = NULL;
	km_str em = KM_STR_NULL;
	const char *done_word;
	km_wr w;
	km_rd r;

	switch (a->cmd) {
	case KM_CLI_CMD_START: key = KM_API_START_MIRROR_TOPICS; done_word = "started"; break;
	case KM_CLI_CMD_STOP: key = KM_API_STOP_MIRROR_TOPICS; done_word = "stopped"; break;
	case KM_CLI_CMD_PROMOTE: key = KM_API_STOP_MIRROR_TOPICS; done_word = "promoted (stopped at zero lag)"; break;
	case KM_CLI_CMD_PAUSE: key = KM_API_PAUSE_MIRROR_TOPICS; done_word = "paused"; break;
	default: key = KM_API_RESUME_MIRROR_TOPICS; done_word = "resumed"; break;
	}
	if ((a->cmd == KM_CLI_CMD_STOP || a->cmd == KM_CLI_CMD_PROMOTE) && a->dry_run)
		return cmd_stop_dry_run(x);
	if ((v = version_of(x, key)) < 0)
		return KM_CLI_EXIT_ERROR;
	if (a->topics_regex) {
		km_str *names = NULL;
		size_t n = 0;
		char **sel;
		if (a->cmd == KM_CLI_CMD_START) {
			if (!destination_topics(x, &names, &n))
				return KM_CLI_EXIT_ERROR;
		} else {
			int rc = mirror_topics(x, &names, &n);
			if (rc != KM_CLI_EXIT_OK)
				return rc;
		}
		if (!regex_select(x, a->topics_regex, names, n, &sel, &ntopics))
			return KM_CLI_EXIT_ERROR;
		if (ntopics == 0) {
			say_err(x, "no %s topic matches --topics-regex '%s'",
				a->cmd == KM_CLI_CMD_START ? "destination" : "mirror", a->topics_regex);
			return KM_CLI_EXIT_ERROR;
		}
		topics = sel;
	}
	if (a->cmd == KM_CLI_CMD_PROMOTE) {
		int rc = wait_zero_lag(x, topics, ntopics);
		if (rc != KM_CLI_EXIT_OK)
			return rc;
	}
	if (a->cmd == KM_CLI_CMD_START && a->dry_run)
		return cmd_start_dry_run(x, topics, ntopics);
	km_wr_init(&w);
	switch (a->cmd) {
	case KM_CLI_CMD_START: BUILD_TOPICS_REQUEST(km_start_mirror_topics, &w, v, a->mirror, topics, ntopics); break;
	case KM_CLI_CMD_STOP:
	case KM_CLI_CMD_PROMOTE: BUILD_TOPICS_REQUEST(km_stop_mirror_topics, &w, v, a->mirror, topics, ntopics); break;
	case KM_CLI_CMD_PAUSE: BUILD_TOPICS_REQUEST(km_pause_mirror_topics, &w, v, a->mirror, topics, ntopics); break;
	default: BUILD_TOPICS_REQUEST(km_resume_mirror_topics, &w, v, a->mirror, topics, ntopics); break;
	}
	if (!call(x, key, &w, v, &r))
		return KM_CLI_EXIT_ERROR;
	switch (a->cmd) {
	case KM_CLI_CMD_START: DECODE_TOPICS_RESPONSE(km_start_mirror_topics, key, &r, v, ec, em, res, nres); break;
	case KM_CLI_CMD_STOP:
	case KM_CLI_CMD_PROMOTE: DECODE_TOPICS_RESPONSE(km_stop_mirror_topics, key, &r, v, ec, em, res, nres); break;
	case KM_CLI_CMD_PAUSE: DECODE_TOPICS_RESPONSE(km_pause_mirror_topics, key, &r, v, ec, em, res, nres); break;
	default: DECODE_TOPICS_RESPONSE(km_resume_mirror_topics, key, &r, v, ec, em, res, nres); break;
	}
	if (ec)
		return top_error(x, ec, em);
	for (size_t i = 0; i < nres; i++)
		failed += res[i].error_code != 0;
	for (size_t i = 0; i < nres; i++)
		if (res[i].error_code) {
			/* One line for the first refusal; every topic's result is on stdout. */
			char m[1024];
			message_of(res[i].error_code, res[i].error_message, m, sizeof(m));
			if (nres > 1)
				say_err(x, "%zu of %zu topics refused; first: %s: %s", failed, nres,
					km_err_name(res[i].error_code), m);
			else
				say_err(x, "%s: %s", km_err_name(res[i].error_code), m);
			break;
		}
	if (a->json) {
		km_cli_json j;
		km_cli_json_init(&j, x->out);
		km_cli_json_obj(&j);
		km_cli_json_key(&j, "mirror");
		km_cli_json_str(&j, a->mirror);
		km_cli_json_key(&j, "operation");
		km_cli_json_str(&j, km_cli_cmd_name(a->cmd));
		km_cli_json_key(&j, "topics");
		km_cli_json_arr(&j);
		for (size_t i = 0; i < nres; i++) {
			km_cli_json_obj(&j);
			km_cli_json_key(&j, "name");
			km_cli_json_strn(&j, res[i].name.p, res[i].name.len);
			km_cli_json_key(&j, "error");
			json_error(&j, res[i].error_code, res[i].error_message);
			km_cli_json_obj_end(&j);
		}
		km_cli_json_arr_end(&j);
		km_cli_json_obj_end(&j);
	} else {
		static const char *const hdr[] = {"TOPIC", "RESULT", "MESSAGE"};
		km_cli_table t;
		if (!km_cli_table_init(&t, sizeof(hdr) / sizeof(hdr[0]), hdr))
			return KM_CLI_EXIT_ERROR;
		for (size_t i = 0; i < nres; i++) {
			char name[512], m[1024];
			const char *row[] = {name, res[i].error_code ? km_err_name(res[i].error_code) : done_word,
					     res[i].error_code ? m : NULL};
			snprintf(name, sizeof(name), "%.*s", (int)res[i].name.len, res[i].name.p);
			message_of(res[i].error_code, res[i].error_message, m, sizeof(m));
			km_cli_table_row(&t, row);
		}
		km_cli_table_print(&t, x->out);
		km_cli_table_free(&t);
	}
	return failed ? KM_CLI_EXIT_ERROR : KM_CLI_EXIT_OK;
}

/* ---- last-mirrored-offsets ---- */

static int cmd_last_offsets(ctx *x)
{
	const km_cli_args *a = x->a;
	int16_t v = version_of(x, KM_API_LAST_MIRRORED_OFFSETS);
	km_last_mirrored_offsets_request m;
	km_last_mirrored_offsets_request_topic_data *td = NULL;
	km_last_mirrored_offsets_response resp;
	size_t failed = 0;
	km_wr w;
	km_rd r;

	if (v < 0)
		return KM_CLI_EXIT_ERROR;
	km_last_mirrored_offsets_request_init(&m);
	m.mirror_name = km_str_c(a->mirror);
	if (a->topics) {
		td = km_arena_calloc(&x->arena, (a->ntopics ? a->ntopics : 1) * sizeof(*td));
		if (!td)
			return KM_CLI_EXIT_ERROR;
		for (size_t i = 0; i < a->ntopics; i++) {
			km_last_mirrored_offsets_request_topic_data_init(&td[i]);
			td[i].name = km_str_c(a->topics[i]);
			td[i].partitions.count = -1; /* all partitions */
		}
		m.topics.items = td;
		m.topics.count = (int32_t)a->ntopics;
	} else
		m.topics.count = -1;
	km_wr_init(&w);
	km_last_mirrored_offsets_request_encode(&w, v, &m);
	if (!call(x, KM_API_LAST_MIRRORED_OFFSETS, &w, v, &r))
		return KM_CLI_EXIT_ERROR;
	km_last_mirrored_offsets_response_init(&resp);
	if (!decoded(x, km_last_mirrored_offsets_response_decode(&r, v, &resp, &x->arena), KM_API_LAST_MIRRORED_OFFSETS,
		     v, &r))
		return KM_CLI_EXIT_ERROR;
	if (resp.error_code)
		return top_error(x, resp.error_code, resp.error_message);
	for (int32_t i = 0; i < resp.topics.count; i++) {
		const km_last_mirrored_offsets_response_topic_result *t = &resp.topics.items[i];
		if (t->error_code && failed++ == 0) {
			char msg[1024];
			message_of(t->error_code, t->error_message, msg, sizeof(msg));
			say_err(x, "%s: %s", km_err_name(t->error_code), msg);
		}
	}
	if (a->json) {
		km_cli_json j;
		km_cli_json_init(&j, x->out);
		km_cli_json_obj(&j);
		km_cli_json_key(&j, "mirror");
		km_cli_json_str(&j, a->mirror);
		km_cli_json_key(&j, "topics");
		km_cli_json_arr(&j);
		for (int32_t i = 0; i < resp.topics.count; i++) {
			const km_last_mirrored_offsets_response_topic_result *t = &resp.topics.items[i];
			km_cli_json_obj(&j);
			km_cli_json_key(&j, "name");
			km_cli_json_strn(&j, t->name.p, t->name.len);
			km_cli_json_key(&j, "error");
			json_error(&j, t->error_code, t->error_message);
			km_cli_json_key(&j, "partitions");
			km_cli_json_arr(&j);
			for (int32_t p = 0; p < t->partitions.count; p++) {
				const km_last_mirrored_offsets_response_partition_result *pr = &t->partitions.items[p];
				km_cli_json_obj(&j);
				km_cli_json_key(&j, "partition");
				km_cli_json_int(&j, pr->partition_index);
				km_cli_json_key(&j, "state");
				km_cli_json_strn(&j, pr->state.p, pr->state.len);
				km_cli_json_key(&j, "last_mirrored_offset");
				km_cli_json_int(&j, pr->last_mirrored_offset);
				km_cli_json_key(&j, "last_mirrored_epoch");
				km_cli_json_int(&j, pr->last_mirrored_epoch);
				km_cli_json_obj_end(&j);
			}
			km_cli_json_arr_end(&j);
			km_cli_json_obj_end(&j);
		}
		km_cli_json_arr_end(&j);
		km_cli_json_obj_end(&j);
	} else {
		static const char *const hdr[] = {"TOPIC", "PARTITION", "STATE", "LAST-MIRRORED-OFFSET", "LAST-MIRRORED-EPOCH",
						  "ERROR"};
		km_cli_table tb;
		if (!km_cli_table_init(&tb, sizeof(hdr) / sizeof(hdr[0]), hdr))
			return KM_CLI_EXIT_ERROR;
		for (int32_t i = 0; i < resp.topics.count; i++) {
			const km_last_mirrored_offsets_response_topic_result *t = &resp.topics.items[i];
			char name[512];
			snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.p);
			if (t->error_code) {
				char msg[1024], e[1200];
				const char *row[] = {name, NULL, NULL, NULL, NULL, e};
				message_of(t->error_code, t->error_message, msg, sizeof(msg));
				snprintf(e, sizeof(e), "%s: %s", km_err_name(t->error_code), msg);
				km_cli_table_row(&tb, row);
				continue;
			}
			for (int32_t p = 0; p < t->partitions.count; p++) {
				const km_last_mirrored_offsets_response_partition_result *pr = &t->partitions.items[p];
				char part[16], st[64], off[24], ep[16];
				const char *row[] = {name, part, st, off, ep, NULL};
				snprintf(part, sizeof(part), "%d", pr->partition_index);
				snprintf(st, sizeof(st), "%.*s", (int)pr->state.len, pr->state.p);
				num_or_dash(pr->last_mirrored_offset, off, sizeof(off));
				num_or_dash(pr->last_mirrored_epoch, ep, sizeof(ep));
				km_cli_table_row(&tb, row);
			}
		}
		km_cli_table_print(&tb, x->out);
		km_cli_table_free(&tb);
	}
	return failed ? KM_CLI_EXIT_ERROR : KM_CLI_EXIT_OK;
}

/* ---- reverse: promote here, then mirror back on the peer ---- */

/* Whether every partition of topics is STOPPED here; -1 when describe failed (said). */
static int all_stopped(ctx *x, char *const *topics, size_t ntopics)
{
	km_describe_mirrors_response resp;
	const km_describe_mirrors_response_described_mirror *dm;
	int rc;

	if ((rc = describe_one(x, topics, ntopics, &resp, &dm)) != KM_CLI_EXIT_OK)
		return -1;
	for (int32_t t = 0; t < dm->topics.count; t++)
		for (int32_t p = 0; p < dm->topics.items[t].partitions.count; p++)
			if (!km_str_eq_c(dm->topics.items[t].partitions.items[p].state, "STOPPED"))
				return 0;
	return 1;
}

static int cmd_reverse(ctx *x)
{
	const km_cli_args *a = x->a;
	char *const *topics = a->topics;
	size_t ntopics = a->ntopics;
	km_cli_args sub;
	km_cli_kvs cfg = {0};
	FILE *quiet;
	int rc, st;
	bool absent;
	struct timespec t0, now;

	if (a->topics_regex) {
		km_str *names = NULL;
		size_t n = 0;
		char **sel;
		if ((rc = mirror_topics(x, &names, &n)) != KM_CLI_EXIT_OK)
			return rc;
		if (!regex_select(x, a->topics_regex, names, n, &sel, &ntopics))
			return KM_CLI_EXIT_ERROR;
		if (!ntopics) {
			say_err(x, "no mirror topic matches --topics-regex '%s'", a->topics_regex);
			return KM_CLI_EXIT_ERROR;
		}
		topics = sel;
	}
	/* 1. Promote here, unless every partition is STOPPED already (a failover done by hand). */
	if ((st = all_stopped(x, topics, ntopics)) < 0)
		return KM_CLI_EXIT_ERROR;
	if (!st) {
		sub = *a;
		sub.cmd = KM_CLI_CMD_PROMOTE;
		sub.topics = (char **)topics;
		sub.ntopics = ntopics;
		sub.topics_regex = NULL;
		if ((rc = km_cli_run(&sub, x->out, x->err)) != KM_CLI_EXIT_OK) {
			say_err(x, "reverse: stopped at the promote of mirror %s here; nothing was done on %s", a->mirror,
				a->peer_bootstrap);
			return rc;
		}
		clock_gettime(CLOCK_MONOTONIC, &t0);
		while ((st = all_stopped(x, topics, ntopics)) == 0) {
			clock_gettime(CLOCK_MONOTONIC, &now);
			if ((int64_t)(now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 > a->wait_ms) {
				say_err(x, "reverse: the topics are not all STOPPED here after %lld ms; nothing was done on "
					"%s (run reverse again once describe shows them STOPPED)", (long long)a->wait_ms,
					a->peer_bootstrap);
				return KM_CLI_EXIT_ERROR;
			}
			nanosleep(&(struct timespec){0, 200 * 1000000L}, NULL);
		}
		if (st < 0)
			return KM_CLI_EXIT_ERROR;
	}
	/* 2. On the peer: the mirror back from this kmirrord, unless it exists. */
	memset(&sub, 0, sizeof(sub));
	sub.bootstrap = a->peer_bootstrap;
	sub.command_config = a->command_config;
	sub.json = a->json;
	sub.timeout_ms = a->timeout_ms;
	sub.wait_ms = a->wait_ms;
	sub.mirror = a->peer_mirror;
	sub.cmd = KM_CLI_CMD_DESCRIBE;
	{
		/* Only "no such mirror" means create it; any other failure is said and ends here. */
		char *said = NULL;
		size_t said_len = 0;
		FILE *nul = fopen("/dev/null", "w");
		quiet = open_memstream(&said, &said_len);
		rc = quiet && nul ? km_cli_run(&sub, nul, quiet) : KM_CLI_EXIT_ERROR;
		if (quiet)
			fclose(quiet);
		if (nul)
			fclose(nul);
		absent = rc != KM_CLI_EXIT_OK && said && strstr(said, "UNKNOWN_CLUSTER_MIRROR");
		if (rc != KM_CLI_EXIT_OK && !absent)
			say_err(x, "reverse: the topics are STOPPED here (failed over); mirror %s on %s could not be "
				"described: %s", a->peer_mirror, a->peer_bootstrap, said && *said ? said : "no answer");
		free(said);
		if (rc != KM_CLI_EXIT_OK && !absent)
			return rc;
	}
	if (absent) {
		if (!km_cli_kvs_set(&cfg, "bootstrap.servers", a->bootstrap))
			return KM_CLI_EXIT_ERROR;
		sub.cmd = KM_CLI_CMD_CREATE;
		sub.configs = cfg;
		rc = km_cli_run(&sub, x->out, x->err);
		km_cli_kvs_free(&cfg);
		sub.configs = (km_cli_kvs){0};
		if (rc != KM_CLI_EXIT_OK) {
			say_err(x, "reverse: the topics are STOPPED here (failed over); creating mirror %s on %s failed: "
				"create it there by hand, then start it", a->peer_mirror, a->peer_bootstrap);
			return rc;
		}
	}
	/* 3. Start it on the same topics: a failback start mirrors only the delta. */
	sub.cmd = KM_CLI_CMD_START;
	sub.topics = (char **)topics;
	sub.ntopics = ntopics;
	if ((rc = km_cli_run(&sub, x->out, x->err)) != KM_CLI_EXIT_OK)
		say_err(x, "reverse: the topics are STOPPED here and mirror %s exists on %s; its start failed: start it "
			"there by hand", a->peer_mirror, a->peer_bootstrap);
	return rc;
}

/* ---- run ---- */

/* A missing or unreadable PEM file is a mistake in the properties: say which property, before connecting. */
static bool tls_files_readable(const km_cli_client *cl, const char *props, FILE *errf)
{
	const struct {
		const char *prop, *path;
	} files[] = {
		{"ssl.ca.location", cl->ca_file},
		{"ssl.certificate.location", cl->cert_file},
		{"ssl.key.location", cl->key_file},
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
static km_cli_conn *open_conn(const km_cli_args *a, const char *bootstrap, FILE *errf, int *rc)
{
	km_cli_client cl = {0};
	km_cli_kvs props = {0};
	km_cli_conn *cc;
	char err[1024], warn[512];

	*rc = KM_CLI_EXIT_USAGE;
	if (a->command_config) {
		if (km_cli_props_load(a->command_config, &props, err, sizeof(err)) != KM_OK) {
			fprintf(errf, "kmirror: --command-config: %s\n", err);
			return NULL;
		}
	}
	if (km_cli_client_from_props(&props, &cl, err, sizeof(err), warn, sizeof(warn)) != KM_OK) {
		fprintf(errf, "kmirror: --command-config %s: %s\n", a->command_config ? a->command_config : "", err);
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
	cc = km_cli_connect(bootstrap, &cl, a->timeout_ms, err, sizeof(err));
	km_cli_client_free(&cl);
	if (!cc) {
		fprintf(errf, "kmirror: %s\n", err); /* the reason names the address */
		*rc = KM_CLI_EXIT_ERROR;
	}
	return cc;
}

int km_cli_run(const km_cli_args *a, FILE *out, FILE *errf)
{
	ctx x = {.a = a, .out = out, .err = errf, .cmd = km_cli_cmd_name(a->cmd)};
	int rc;

	if (a->cmd == KM_CLI_CMD_SWAP_UPSTREAM)
		return km_cli_swap_upstream(a, out, errf);
	if (!(x.cc = open_conn(a, a->bootstrap, errf, &rc)))
		return rc;
	km_arena_init(&x.arena, ARENA_CAP);
	switch (a->cmd) {
	case KM_CLI_CMD_CREATE: rc = cmd_create(&x); break;
	case KM_CLI_CMD_LIST: rc = cmd_list(&x); break;
	case KM_CLI_CMD_DESCRIBE: rc = cmd_describe(&x); break;
	case KM_CLI_CMD_ALTER: rc = cmd_alter(&x); break;
	case KM_CLI_CMD_DELETE: rc = cmd_delete(&x); break;
	case KM_CLI_CMD_START:
	case KM_CLI_CMD_STOP:
	case KM_CLI_CMD_PROMOTE:
	case KM_CLI_CMD_PAUSE:
	case KM_CLI_CMD_RESUME: rc = cmd_topics(&x); break;
	case KM_CLI_CMD_LAST_OFFSETS: rc = cmd_last_offsets(&x); break;
	case KM_CLI_CMD_REVERSE: rc = cmd_reverse(&x); break;
	default: rc = KM_CLI_EXIT_USAGE; break;
	}
	if (km_arena_err(&x.arena) != KM_OK && rc == KM_CLI_EXIT_OK) {
		say_err(&x, "out of memory");
		rc = KM_CLI_EXIT_ERROR;
	}
	fflush(out);
	free(x.resp);
	km_arena_free(&x.arena);
	km_cli_conn_free(x.cc);
	return rc;
}
