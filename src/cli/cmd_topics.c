/* kmirror start, stop, pause, resume and promote: topics by name or pattern, the dry runs, waiting for zero lag. */
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/last_mirrored_offsets_request.h"
#include "kmirror/msg/last_mirrored_offsets_response.h"
#include "kmirror/msg/list_offsets_request.h"
#include "kmirror/msg/list_offsets_response.h"
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

/* ---- start, stop, pause, resume ---- */

/* One topic's result, whichever RPC it came from. */
typedef struct topic_result {
	km_str name;
	int16_t error_code;
	km_str error_message;
} topic_result;

/* Build the request of one of the four topic RPCs (the same layout, four generated types). */
#define BUILD_TOPICS_REQUEST(prefix, w, v, mirror, names, n, ...)                                      \
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
		__VA_ARGS__;                                                                           \
		prefix##_request_encode(w, v, &m_);                                                    \
	} while (0)

/* Decode its response into top-level error and results (in the arena). */
#define DECODE_TOPICS_RESPONSE(prefix, key, r, v, ec, em, res, nres)                                  \
	do {                                                                                           \
		prefix##_response m_;                                                                  \
		prefix##_response_init(&m_);                                                           \
		if (!km_cmd_decoded(x, prefix##_response_decode(r, v, &m_, &x->arena), key, v, r))            \
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
bool km_cmd_regex_select(ctx *x, const char *re, km_str *names, size_t n, char ***out, size_t *nout)
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
		km_cmd_say_err(x, "--topics-regex '%s': %s", re, errbuf);
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
	char why[256] = "";

	if (km_cmd_topic_names(x, names, n, why, sizeof(why)))
		return true;
	if (why[0])
		km_cmd_say_err(x, "kmirrord %s", why);
	return false;
}

/* The mirror's topics (DescribeMirrors), for stop/pause/resume --topics-regex. */
/* The mirror of --mirror described (its topics, or only these): *dm, or an exit code from an error said. */
int km_cmd_describe_one(ctx *x, char *const *topics, size_t ntopics, km_describe_mirrors_response *resp,
			const km_describe_mirrors_response_described_mirror **dm)
{
	if (!km_cmd_describe_call(x, x->a->mirror, topics, ntopics, resp))
		return KM_CLI_EXIT_ERROR;
	if (resp->error_code)
		return km_cmd_top_error(x, resp->error_code, resp->error_message);
	if (resp->mirrors.count < 1) {
		km_cmd_say_err(x, "UNKNOWN_CLUSTER_MIRROR: no mirror named %s", x->a->mirror);
		return KM_CLI_EXIT_ERROR;
	}
	*dm = &resp->mirrors.items[0];
	if ((*dm)->error_code)
		return km_cmd_top_error(x, (*dm)->error_code, (*dm)->error_message);
	return KM_CLI_EXIT_OK;
}

int km_cmd_mirror_topics(ctx *x, km_str **names, size_t *n)
{
	km_describe_mirrors_response resp;
	const km_describe_mirrors_response_described_mirror *dm;
	int rc = km_cmd_describe_one(x, NULL, 0, &resp, &dm);

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

/* The records at risk of one partition if it stopped now, against the source's end: -1 when either end is unknown. */
static int64_t at_risk_at(const km_describe_mirrors_response_described_partition *dp, int64_t source_end)
{
	int64_t at = stop_point_of(dp);
	if (source_end < 0 || at < 0)
		return -1;
	return source_end > at ? source_end - at : 0;
}

/* The same against the source's end as kmirrord last fetched it. */
static int64_t at_risk_of(const km_describe_mirrors_response_described_partition *dp)
{
	return at_risk_at(dp, dp->source_log_end_offset);
}

static const char dry_run_note_asked[] =
	"SOURCE-END was asked of the source's partition leaders by this command: the records at risk are "
	"exact as of now (a source still written to moves on).";
static const char dry_run_note_end[] =
	"SOURCE-END is the source's end offset as kmirrord last fetched it (its age in brackets): records "
	"written to the source after that fetch are not counted.";
static const char dry_run_note_txn[] =
	"IN-TXN records were mirrored since the earliest transaction the source has not decided as far as "
	"mirrored began: a stop aborts the open ones (what other producers committed stays), and IN-TXN "
	"counts as at risk (an upper bound).";

/*
 * What stop --dry-run found: the mirror's topics a stop would touch (sel), the names asked (seen),
 * the source's ends asked now (src, from src_at[t] on for topic t; src_ok when every one answered,
 * else src_why), the totals.
 */
typedef struct stop_view {
	const km_describe_mirrors_response_described_mirror *dm;
	bool *sel, *seen;
	km_cmd_src_part *src;
	size_t *src_at, nsrc;
	bool src_ok;
	char src_why[600];
	int64_t now_ms;
	size_t nparts, unknown;
	int64_t total;
} stop_view;

/* Partition p (its index in topic t's list) as asked of the source, or NULL when it was not. */
static const km_cmd_src_part *src_of(const stop_view *v, int32_t t, int32_t p)
{
	const km_cmd_src_part *sp;
	if (!v->src || !v->sel[t])
		return NULL;
	sp = &v->src[v->src_at[t] + (size_t)p];
	return sp->end >= 0 ? sp : NULL;
}

/* The source end a partition's figures use: asked now, else kmirrord's last fetched. */
static int64_t source_end_of(const stop_view *v, int32_t t, int32_t p)
{
	const km_cmd_src_part *sp = src_of(v, t, p);
	return sp ? sp->end : v->dm->topics.items[t].partitions.items[p].source_log_end_offset;
}

/* The topics selected by --topics or --topics-regex, and the records at risk in their partitions. */
static int stop_select(ctx *x, stop_view *v)
{
	const km_cli_args *a = x->a;
	const km_describe_mirrors_response_described_mirror *dm = v->dm;
	char **matched = NULL;
	size_t nmatched = 0, nt = dm->topics.count > 0 ? (size_t)dm->topics.count : 0;

	v->sel = km_arena_calloc(&x->arena, (nt ? nt : 1) * sizeof(*v->sel));
	if (a->topics)
		v->seen = km_arena_calloc(&x->arena, (a->ntopics ? a->ntopics : 1) * sizeof(*v->seen));
	if (!v->sel || (a->topics && !v->seen))
		return KM_CLI_EXIT_ERROR;
	if (a->topics_regex) {
		km_str *names = km_arena_calloc(&x->arena, (nt ? nt : 1) * sizeof(*names));
		if (!names)
			return KM_CLI_EXIT_ERROR;
		for (size_t t = 0; t < nt; t++)
			names[t] = dm->topics.items[t].name;
		if (!km_cmd_regex_select(x, a->topics_regex, names, nt, &matched, &nmatched))
			return KM_CLI_EXIT_ERROR;
	}
	for (int32_t t = 0; t < dm->topics.count; t++) {
		const km_describe_mirrors_response_described_topic *dt = &dm->topics.items[t];

		v->sel[t] = !a->topics_regex;
		for (size_t i = 0; i < nmatched && !v->sel[t]; i++)
			v->sel[t] = km_str_eq_c(dt->name, matched[i]);
		for (size_t i = 0; a->topics && i < a->ntopics; i++)
			if (km_str_eq_c(dt->name, a->topics[i]))
				v->seen[i] = true;
	}
	if (a->topics_regex && !nmatched) {
		km_cmd_say_err(x, "no mirror topic matches --topics-regex '%s'", a->topics_regex);
		return KM_CLI_EXIT_ERROR;
	}
	return KM_CLI_EXIT_OK;
}

/* The partitions a stop would touch and their records at risk (a STOPPED one is writable already). */
static void stop_totals(stop_view *v)
{
	for (int32_t t = 0; t < v->dm->topics.count; t++) {
		const km_describe_mirrors_response_described_topic *dt = &v->dm->topics.items[t];
		for (int32_t p = 0; v->sel[t] && p < dt->partitions.count; p++) {
			int64_t r = at_risk_at(&dt->partitions.items[p], source_end_of(v, t, p));
			if (km_str_eq_c(dt->partitions.items[p].state, "STOPPED"))
				continue;
			v->nparts++;
			if (r < 0)
				v->unknown++;
			else
				v->total += r;
		}
	}
}

/* The mirror's bootstrap.servers (its source) into buf; "" when it has none. */
static void source_of(const km_describe_mirrors_response_described_mirror *dm, char *buf, size_t len)
{
	buf[0] = '\0';
	for (int32_t i = 0; i < dm->configs.count; i++)
		if (km_str_eq_c(dm->configs.items[i].name, "bootstrap.servers") && dm->configs.items[i].value.len > 0)
			snprintf(buf, len, "%.*s", (int)dm->configs.items[i].value.len, dm->configs.items[i].value.p);
}

/*
 * The source's ends of every selected partition, asked now (bootstrap.servers of the mirror, with
 * --command-config's settings). A source that cannot be reached leaves kmirrord's last fetched
 * figures in use, and why in src_why.
 */
static bool ask_source(ctx *x, stop_view *v)
{
	const km_describe_mirrors_response_described_mirror *dm = v->dm;
	char source[1024] = "";
	size_t n = 0;

	source_of(dm, source, sizeof(source));
	if (!(v->src_at = km_arena_calloc(&x->arena, (dm->topics.count > 0 ? (size_t)dm->topics.count : 1) * sizeof(size_t))))
		return false;
	for (int32_t t = 0; t < dm->topics.count; t++) {
		v->src_at[t] = n;
		if (v->sel[t])
			n += dm->topics.items[t].partitions.count > 0 ? (size_t)dm->topics.items[t].partitions.count : 0;
	}
	if (!n)
		return true;
	if (!(v->src = km_arena_calloc(&x->arena, n * sizeof(*v->src))))
		return false;
	for (int32_t t = 0; t < dm->topics.count; t++) {
		const km_describe_mirrors_response_described_topic *dt = &dm->topics.items[t];
		char *name;
		if (!v->sel[t])
			continue;
		if (!(name = km_arena_calloc(&x->arena, (size_t)(dt->name.len > 0 ? dt->name.len : 0) + 1)))
			return false;
		memcpy(name, dt->name.p, dt->name.len > 0 ? (size_t)dt->name.len : 0);
		for (int32_t p = 0; p < dt->partitions.count; p++)
			v->src[v->src_at[t] + (size_t)p] = (km_cmd_src_part){name, dt->partitions.items[p].partition_index, -1, -1, -1};
	}
	v->nsrc = n;
	if (!*source)
		snprintf(v->src_why, sizeof(v->src_why), "the mirror has no bootstrap.servers");
	else
		v->src_ok = km_cmd_source_ends(x, source, v->src, n, v->src_why, sizeof(v->src_why));
	return true;
}

/* How old kmirrord's last fetched source end of dp is (ms), -1 when not known. */
static int64_t end_age_of(const stop_view *v, const km_describe_mirrors_response_described_partition *dp)
{
	if (dp->source_log_end_offset < 0 || dp->source_log_end_time_ms <= 0)
		return -1;
	return v->now_ms > dp->source_log_end_time_ms ? v->now_ms - dp->source_log_end_time_ms : 0;
}

static void stop_json_partition(km_cli_json *j, const stop_view *v, int32_t t, int32_t p)
{
	const km_describe_mirrors_response_described_partition *dp = &v->dm->topics.items[t].partitions.items[p];
	const km_cmd_src_part *sp = src_of(v, t, p);
	bool stopped = km_str_eq_c(dp->state, "STOPPED");
	km_cli_json_obj(j);
	km_cli_json_key(j, "partition");
	km_cli_json_int(j, dp->partition_index);
	km_cli_json_key(j, "state");
	km_cli_json_strn(j, dp->state.p, dp->state.len);
	km_cli_json_key(j, "mirrored_offset");
	km_cli_json_int(j, dp->mirrored_offset);
	km_cli_json_key(j, "source_end_offset");
	km_cli_json_int(j, source_end_of(v, t, p));
	km_cli_json_key(j, "source_end_asked");
	km_cli_json_bool(j, sp != NULL);
	km_cli_json_key(j, "source_last_stable_offset");
	km_cli_json_int(j, sp ? sp->lso : -1);
	km_cli_json_key(j, "last_fetched_source_end_offset");
	km_cli_json_int(j, dp->source_log_end_offset);
	km_cli_json_key(j, "last_fetched_age_ms");
	km_cli_json_int(j, end_age_of(v, dp));
	km_cli_json_key(j, "records_in_open_transactions");
	km_cli_json_int(j, stopped ? -1 : in_txn_of(dp));
	km_cli_json_key(j, "records_at_risk");
	km_cli_json_int(j, stopped ? -1 : at_risk_at(dp, source_end_of(v, t, p)));
	km_cli_json_obj_end(j);
}

static void stop_json(ctx *x, const stop_view *v)
{
	const km_cli_args *a = x->a;
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
	for (int32_t t = 0; t < v->dm->topics.count; t++) {
		const km_describe_mirrors_response_described_topic *dt = &v->dm->topics.items[t];
		if (!v->sel[t])
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
		for (int32_t p = 0; p < dt->partitions.count; p++)
			stop_json_partition(&j, v, t, p);
		km_cli_json_arr_end(&j);
		km_cli_json_obj_end(&j);
	}
	/* Names stop would refuse, with the error it would give. */
	for (size_t i = 0; a->topics && i < a->ntopics; i++) {
		char m[600];
		if (v->seen[i])
			continue;
		snprintf(m, sizeof(m), "topic %s is not in mirror %s", a->topics[i], a->mirror);
		km_cli_json_obj(&j);
		km_cli_json_key(&j, "name");
		km_cli_json_str(&j, a->topics[i]);
		km_cli_json_key(&j, "error");
		km_cmd_json_error(&j, KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR, km_str_c(m));
		km_cli_json_key(&j, "state");
		km_cli_json_null(&j);
		km_cli_json_key(&j, "partitions");
		km_cli_json_arr(&j);
		km_cli_json_arr_end(&j);
		km_cli_json_obj_end(&j);
	}
	km_cli_json_arr_end(&j);
	km_cli_json_key(&j, "partitions");
	km_cli_json_int(&j, (int64_t)v->nparts);
	km_cli_json_key(&j, "partitions_unknown");
	km_cli_json_int(&j, (int64_t)v->unknown);
	km_cli_json_key(&j, "total_records_at_risk");
	km_cli_json_int(&j, v->total);
	km_cli_json_key(&j, "source_asked");
	km_cli_json_bool(&j, v->src_ok);
	km_cli_json_key(&j, "source_error");
	if (v->src_ok || !v->src_why[0])
		km_cli_json_null(&j);
	else
		km_cli_json_str(&j, v->src_why);
	km_cli_json_key(&j, "notes");
	km_cli_json_arr(&j);
	km_cli_json_str(&j, v->src_ok ? dry_run_note_asked : dry_run_note_end);
	km_cli_json_str(&j, dry_run_note_txn);
	km_cli_json_arr_end(&j);
	km_cli_json_obj_end(&j);
}

static int stop_table(ctx *x, const stop_view *v)
{
	static const char *const hdr[] = {"TOPIC", "PARTITION", "STATE", "MIRRORED", "SOURCE-END", "IN-TXN", "AT-RISK"};
	km_cli_table tb;
	if (!km_cli_table_init(&tb, sizeof(hdr) / sizeof(hdr[0]), hdr))
		return KM_CLI_EXIT_ERROR;
	for (int32_t t = 0; t < v->dm->topics.count; t++) {
		const km_describe_mirrors_response_described_topic *dt = &v->dm->topics.items[t];
		char topic[512];
		if (!v->sel[t])
			continue;
		snprintf(topic, sizeof(topic), "%.*s", (int)dt->name.len, dt->name.p);
		for (int32_t p = 0; p < dt->partitions.count; p++) {
			const km_describe_mirrors_response_described_partition *dp = &dt->partitions.items[p];
			char part[16], st[64], mir[24], end[48], txn[24], risk[24];
			const char *row[] = {topic, part, st, mir, end, txn, risk};
			int64_t r = at_risk_at(dp, source_end_of(v, t, p)), age = end_age_of(v, dp);
			snprintf(part, sizeof(part), "%d", dp->partition_index);
			snprintf(st, sizeof(st), "%.*s", (int)dp->state.len, dp->state.p);
			km_cmd_num_or_dash(dp->mirrored_offset, mir, sizeof(mir));
			km_cmd_num_or_dash(source_end_of(v, t, p), end, sizeof(end));
			if (!src_of(v, t, p) && dp->source_log_end_offset >= 0 && age >= 0)
				snprintf(end + strlen(end), sizeof(end) - strlen(end), " (%llds ago)", (long long)(age / 1000));
			km_cmd_num_or_dash(km_str_eq_c(dp->state, "STOPPED") ? -1 : in_txn_of(dp), txn, sizeof(txn));
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
	fprintf(x->out, "\nTotal: %lld records at risk in %zu partitions", (long long)v->total, v->nparts);
	if (v->unknown)
		fprintf(x->out, " (%zu more unknown: ?)", v->unknown);
	fprintf(x->out, ". Dry run: nothing was stopped.\n");
	if (!v->src_ok && v->src_why[0])
		fprintf(x->out, "The source was not asked: %s.\n", v->src_why);
	fprintf(x->out, "%s\n%s\n", v->src_ok ? dry_run_note_asked : dry_run_note_end, dry_run_note_txn);
	return KM_CLI_EXIT_OK;
}

/*
 * stop --dry-run: what a stop now would leave behind, from one DescribeMirrors (no state changes)
 * and the source's end offsets asked of its partition leaders now. A source that cannot be reached
 * (it may be the cluster that is gone) is said, and the pipeline's last fetched ends are used with
 * their age.
 */
static int cmd_stop_dry_run(ctx *x)
{
	const km_cli_args *a = x->a;
	km_describe_mirrors_response resp;
	stop_view v = {0};
	size_t missing = 0;
	int rc = km_cmd_describe_one(x, a->topics, a->ntopics, &resp, &v.dm);

	if (rc != KM_CLI_EXIT_OK || (rc = stop_select(x, &v)) != KM_CLI_EXIT_OK)
		return rc;
	v.now_ms = km_wall_ms();
	if (!ask_source(x, &v))
		return KM_CLI_EXIT_ERROR;
	stop_totals(&v);
	/* A topic stop would refuse is named, as stop names it; the others are still reported. */
	for (size_t i = 0; a->topics && i < a->ntopics; i++)
		if (!v.seen[i] && missing++ == 0) {
			km_cmd_say_err(x, "%s: topic %s is not in mirror %s", km_err_name(KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR),
				       a->topics[i], a->mirror);
			rc = KM_CLI_EXIT_ERROR;
		}
	if (a->json)
		stop_json(x, &v);
	else if (stop_table(x, &v) != KM_CLI_EXIT_OK)
		return KM_CLI_EXIT_ERROR;
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
	int64_t t0 = km_mono_ms(), waited = 0, said = -1;

	for (;;) {
		km_describe_mirrors_response resp;
		const km_describe_mirrors_response_described_mirror *dm;
		char behind[1024] = "";
		size_t nbehind = 0, len = 0;
		int64_t records = 0;
		km_arena keep = x->arena; /* each round's answer in an arena of its own */
		int rc;

		km_arena_init(&x->arena, ARENA_CAP);
		if ((rc = km_cmd_describe_one(x, topics, ntopics, &resp, &dm)) != KM_CLI_EXIT_OK) {
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
		waited = km_mono_ms() - t0;
		if (waited >= a->wait_ms) {
			km_cmd_say_err(x, "promote timed out: %zu partition(s) still behind after %lld ms (%lld records): %s; "
				"nothing was stopped (stop fails over at once, promote --wait-ms waits longer)", nbehind,
				(long long)waited, (long long)records, behind);
			return KM_CLI_EXIT_TIMEOUT;
		}
		if (said < 0 || waited - said >= 5000) {
			said = waited;
			fprintf(stderr, "kmirror: promote: waiting for %zu partition(s), %lld records behind: %s\n", nbehind,
				(long long)records, behind);
		}
		nanosleep(&(struct timespec){0, 500 * 1000000L}, NULL);
	}
}

/* LastMirroredOffsets of the topics from the mirror's source (y: a connection to it); lr stays empty without it. */
static bool ask_last_mirrored(ctx *x, ctx *y, char *const *topics, size_t ntopics,
			      km_last_mirrored_offsets_response *lr)
{
	km_last_mirrored_offsets_request m;
	km_last_mirrored_offsets_request_topic_data *td;
	int16_t v;
	km_wr w;
	km_rd r;

	km_last_mirrored_offsets_response_init(lr);
	lr->topics.count = 0;
	if ((v = km_cli_conn_version(y->cc, KM_API_LAST_MIRRORED_OFFSETS)) < 0)
		return true; /* a plain Kafka cluster: every topic from scratch */
	if (!(td = km_arena_calloc(&x->arena, (ntopics + 1) * sizeof(*td))))
		return false;
	km_last_mirrored_offsets_request_init(&m);
	m.mirror_name = km_str_c("");
	for (size_t i = 0; i < ntopics; i++) {
		km_last_mirrored_offsets_request_topic_data_init(&td[i]);
		td[i].name = km_str_c(topics[i]);
		td[i].partitions.count = -1;
	}
	m.topics.items = td;
	m.topics.count = (int32_t)ntopics;
	/* On y's connection (the source), decoded into the command's arena. */
	km_wr_init(&w);
	km_last_mirrored_offsets_request_encode(&w, v, &m);
	return km_cmd_call(y, KM_API_LAST_MIRRORED_OFFSETS, &w, v, &r) &&
	       km_cmd_decoded(y, km_last_mirrored_offsets_response_decode(&r, v, lr, &x->arena),
			      KM_API_LAST_MIRRORED_OFFSETS, v, &r);
}

/* The topics' metadata here (through kmirrord): their partitions, or UNKNOWN_TOPIC_OR_PARTITION when they are not here yet. */
static bool metadata_here(ctx *x, char *const *topics, size_t ntopics, km_metadata_response *md)
{
	int16_t v = km_cli_conn_version(x->cc, KM_API_METADATA);
	km_metadata_request m;
	km_metadata_request_topic *ts = km_arena_calloc(&x->arena, (ntopics + 1) * sizeof(*ts));

	km_metadata_response_init(md);
	md->topics.count = 0;
	if (v < 1 || !ts)
		return v < 1; /* no partitions to report: the table says "-" */
	km_metadata_request_init(&m);
	for (size_t i = 0; i < ntopics; i++) {
		km_metadata_request_topic_init(&ts[i]);
		ts[i].name = km_str_c(topics[i]);
	}
	m.topics.items = ts;
	m.topics.count = (int32_t)ntopics;
	m.allow_auto_topic_creation = false;
	return km_cmd_rpc(x, KM_API_METADATA, v, &m, md);
}

/* ListOffsets here at ts (-1: the ends, -2: the log starts) of every partition md names. */
/*
 * ListOffsets of md's partitions led by broker leader, at ts, on a connection of its own to that
 * broker's address in md (through kmirrord: its listener for the broker); each answer's offset and
 * error go to the matching partition of lo. False: out of memory or a malformed answer (said); a
 * broker that cannot be reached leaves its partitions as they were (not known).
 */
static bool offsets_of_leader(ctx *x, const km_metadata_response *md, int32_t leader, int64_t ts, int16_t lv,
			      km_list_offsets_response *lo)
{
	km_list_offsets_request m;
	km_list_offsets_request_list_offsets_topic *lt;
	km_list_offsets_response one;
	const km_metadata_response_broker *b = NULL;
	char addr[300], err[1024] = "";
	int32_t nt = 0;
	ctx y = *x;
	int rc;
	km_wr w;
	km_rd r;
	bool ok;

	for (int32_t i = 0; i < md->brokers.count && !b; i++)
		if (md->brokers.items[i].node_id == leader)
			b = &md->brokers.items[i];
	if (!b || b->host.len <= 0 || b->host.len > 255)
		return true;
	snprintf(addr, sizeof(addr), memchr(b->host.p, ':', (size_t)b->host.len) ? "[%.*s]:%d" : "%.*s:%d",
		 (int)b->host.len, b->host.p, (int)b->port);
	if (!(lt = km_arena_calloc(&x->arena, (size_t)md->topics.count * sizeof(*lt))))
		return false;
	km_list_offsets_request_init(&m);
	m.replica_id = -1;
	for (int32_t t = 0; t < md->topics.count; t++) {
		const km_metadata_response_topic *mt = &md->topics.items[t];
		km_list_offsets_request_list_offsets_partition *lp;
		int32_t n = 0;
		if (mt->error_code || mt->partitions.count <= 0)
			continue;
		if (!(lp = km_arena_calloc(&x->arena, (size_t)mt->partitions.count * sizeof(*lp))))
			return false;
		for (int32_t k = 0; k < mt->partitions.count; k++) {
			if (mt->partitions.items[k].leader_id != leader)
				continue;
			km_list_offsets_request_list_offsets_partition_init(&lp[n]);
			lp[n].partition_index = mt->partitions.items[k].partition_index;
			lp[n].current_leader_epoch = -1;
			lp[n++].timestamp = ts;
		}
		if (!n)
			continue;
		km_list_offsets_request_list_offsets_topic_init(&lt[nt]);
		lt[nt].name = mt->name;
		lt[nt].partitions.items = lp;
		lt[nt++].partitions.count = n;
	}
	if (!nt)
		return true;
	m.topics.items = lt;
	m.topics.count = nt;
	y.resp = NULL;
	y.resp_len = 0;
	if (!(y.cc = km_cmd_connect(x->a, addr, false, x->a->timeout_ms, x->err, err, sizeof(err), &rc)))
		return true; /* not known: the report says so */
	km_wr_init(&w);
	km_list_offsets_request_encode(&w, lv, &m);
	ok = km_cmd_call(&y, KM_API_LIST_OFFSETS, &w, lv, &r) &&
	     km_cmd_decoded(&y, km_list_offsets_response_decode(&r, lv, &one, &x->arena), KM_API_LIST_OFFSETS, lv, &r);
	for (int32_t t = 0; ok && t < one.topics.count; t++)
		for (int32_t q = 0; q < one.topics.items[t].partitions.count; q++) {
			const km_list_offsets_response_list_offsets_partition_response *a =
				&one.topics.items[t].partitions.items[q];
			for (int32_t u = 0; u < lo->topics.count; u++)
				for (int32_t k = 0; k < lo->topics.items[u].partitions.count; k++) {
					km_list_offsets_response_list_offsets_partition_response *to =
						&lo->topics.items[u].partitions.items[k];
					if (km_str_eq(lo->topics.items[u].name, one.topics.items[t].name) &&
					    to->partition_index == a->partition_index) {
						to->error_code = a->error_code;
						to->offset = a->offset;
					}
				}
		}
	free(y.resp);
	km_cli_conn_free(y.cc);
	return ok;
}

/*
 * ListOffsets at ts (-1 the end, -2 the start) of every partition of md, here: each asked of its
 * leader (one broker answers only for the partitions it leads), into lo (names borrowed from md).
 * A partition whose leader could not be asked keeps LEADER_NOT_AVAILABLE: its offset is not known.
 */
static bool offsets_here(ctx *x, const km_metadata_response *md, int64_t ts, km_list_offsets_response *lo)
{
	km_list_offsets_response_list_offsets_topic_response *tr;
	int32_t *leaders;
	int32_t nl = 0, np = 0;
	int16_t lv;

	km_list_offsets_response_init(lo);
	lo->topics.count = 0;
	if ((lv = km_cli_conn_version(x->cc, KM_API_LIST_OFFSETS)) < 1 || md->topics.count <= 0)
		return true;
	for (int32_t t = 0; t < md->topics.count; t++)
		np += md->topics.items[t].partitions.count > 0 ? md->topics.items[t].partitions.count : 0;
	if (!(tr = km_arena_calloc(&x->arena, (size_t)md->topics.count * sizeof(*tr))) ||
	    !(leaders = km_arena_calloc(&x->arena, ((size_t)np + 1) * sizeof(*leaders))))
		return false;
	for (int32_t t = 0; t < md->topics.count; t++) {
		const km_metadata_response_topic *mt = &md->topics.items[t];
		km_list_offsets_response_list_offsets_partition_response *pr;
		if (mt->error_code || mt->partitions.count <= 0)
			continue;
		if (!(pr = km_arena_calloc(&x->arena, (size_t)mt->partitions.count * sizeof(*pr))))
			return false;
		for (int32_t k = 0; k < mt->partitions.count; k++) {
			int32_t id = mt->partitions.items[k].leader_id;
			bool seen = false;
			pr[k].partition_index = mt->partitions.items[k].partition_index;
			pr[k].error_code = 5; /* LEADER_NOT_AVAILABLE until its leader answers */
			pr[k].offset = -1;
			for (int32_t i = 0; i < nl && !seen; i++)
				seen = leaders[i] == id;
			if (!seen && id >= 0)
				leaders[nl++] = id;
		}
		tr[lo->topics.count].name = mt->name;
		tr[lo->topics.count].partitions.items = pr;
		tr[lo->topics.count++].partitions.count = mt->partitions.count;
	}
	lo->topics.items = tr;
	for (int32_t i = 0; i < nl; i++)
		if (!offsets_of_leader(x, md, leaders[i], ts, lv, lo))
			return false;
	return true;
}

/* The end here of topic/partition, -1 when not known. */
static int64_t end_here_of(const km_list_offsets_response *lo, const char *topic, int32_t partition)
{
	int64_t end = -1;
	for (int32_t t = 0; t < lo->topics.count; t++)
		if (km_str_eq_c(lo->topics.items[t].name, topic))
			for (int32_t q = 0; q < lo->topics.items[t].partitions.count; q++)
				if (lo->topics.items[t].partitions.items[q].partition_index == partition &&
				    !lo->topics.items[t].partitions.items[q].error_code)
					end = lo->topics.items[t].partitions.items[q].offset;
	return end;
}

/* What start --dry-run learned, per topic: here (through kmirrord) and from the mirror's source. */
typedef struct start_view {
	char *const *topics;
	size_t ntopics;
	bool *drill; /* the mirror's and STOPPED here: resumes where the stop left it */
	const km_describe_mirrors_response_described_mirror *dm;
	km_last_mirrored_offsets_response lr; /* the source's kmirrord's answer, and the stop points here */
	km_metadata_response md;              /* the topics here */
	km_list_offsets_response starts, ends;
	int64_t total; /* offsets the start would hide */
} start_view;

/* One partition of a failback or a start after a stop (JSON or a table row). */
static void start_report_partition(ctx *x, km_cli_json *j, km_cli_table *tb, start_view *v, size_t i,
				   const km_last_mirrored_offsets_response_partition_result *pr)
{
	int64_t end = end_here_of(&v->ends, v->topics[i], pr->partition_index);
	int64_t keep = pr->last_mirrored_offset < end ? pr->last_mirrored_offset : end, hidden = -1;
	bool stopped = km_str_eq_c(pr->state, "STOPPED") && pr->last_mirrored_offset >= 0;

	if (stopped && end >= 0) {
		hidden = end - keep;
		v->total += hidden;
	}
	if (x->a->json) {
		km_cli_json_obj(j);
		km_cli_json_key(j, "partition");
		km_cli_json_int(j, pr->partition_index);
		km_cli_json_key(j, "source_state");
		km_cli_json_strn(j, pr->state.p, pr->state.len);
		km_cli_json_key(j, "source_stopped_at");
		km_cli_json_int(j, pr->last_mirrored_offset);
		km_cli_json_key(j, "end_here");
		km_cli_json_int(j, end);
		km_cli_json_key(j, "records_hidden");
		km_cli_json_int(j, hidden);
		km_cli_json_obj_end(j);
	} else {
		char part[16], at[24], e[24], h[24], st[64];
		const char *row[] = {v->topics[i], part, st, at, e, h};
		snprintf(part, sizeof(part), "%d", pr->partition_index);
		if (v->drill[i])
			snprintf(st, sizeof(st), "after the stop");
		else
			snprintf(st, sizeof(st), stopped ? "failback" : "refused (%.*s there)", (int)pr->state.len,
				 pr->state.p);
		km_cmd_num_or_dash(pr->last_mirrored_offset, at, sizeof(at));
		km_cmd_num_or_dash(end, e, sizeof(e));
		km_cmd_num_or_dash(hidden, h, sizeof(h));
		km_cli_table_row(tb, row);
	}
}

/* Whether the mirror described holds topic (in any state). */
static bool in_mirror(const km_describe_mirrors_response_described_mirror *dm, const char *topic)
{
	for (int32_t t = 0; t < dm->topics.count; t++)
		if (km_str_eq_c(dm->topics.items[t].name, topic))
			return true;
	return false;
}

/*
 * A topic started from scratch: every record here is hidden. One that holds records and is in no
 * mirror here is refused without --adopt-existing (as kmirrord refuses it: TOPIC_ALREADY_EXISTS).
 */
static void start_report_scratch(ctx *x, km_cli_json *j, km_cli_table *tb, start_view *v, size_t i)
{
	const km_metadata_response_topic *mt = NULL;
	int64_t held = 0;
	bool refuse;

	for (int32_t t = 0; t < v->md.topics.count && !mt; t++)
		if (km_str_eq_c(v->md.topics.items[t].name, v->topics[i]) && !v->md.topics.items[t].error_code)
			mt = &v->md.topics.items[t];
	for (int32_t k = 0; mt && k < mt->partitions.count; k++) {
		int32_t id = mt->partitions.items[k].partition_index;
		int64_t lo = end_here_of(&v->starts, v->topics[i], id), hi = end_here_of(&v->ends, v->topics[i], id);
		held += lo >= 0 && hi > lo ? hi - lo : 0;
	}
	refuse = held > 0 && !x->a->adopt_existing && !in_mirror(v->dm, v->topics[i]);
	if (!refuse)
		v->total += held;
	if (x->a->json) {
		km_cli_json_key(j, "refused");
		km_cli_json_bool(j, refuse);
		km_cli_json_key(j, "partitions");
		km_cli_json_arr(j);
	} else if (!mt) {
		const char *row[] = {v->topics[i], "*", "from scratch (created)", "-", "-", "0"};
		km_cli_table_row(tb, row);
	}
	for (int32_t k = 0; mt && k < mt->partitions.count; k++) {
		int32_t id = mt->partitions.items[k].partition_index;
		int64_t lo = end_here_of(&v->starts, v->topics[i], id), hi = end_here_of(&v->ends, v->topics[i], id);
		int64_t hidden = lo >= 0 && hi >= lo ? hi - lo : -1;
		if (x->a->json) {
			km_cli_json_obj(j);
			km_cli_json_key(j, "partition");
			km_cli_json_int(j, id);
			km_cli_json_key(j, "log_start_here");
			km_cli_json_int(j, lo);
			km_cli_json_key(j, "end_here");
			km_cli_json_int(j, hi);
			km_cli_json_key(j, "records_hidden");
			km_cli_json_int(j, hidden);
			km_cli_json_obj_end(j);
		} else {
			char part[16], e[24], h[24];
			const char *row[] = {v->topics[i], part, refuse ? "refused (records here)" : "from scratch", "-", e, h};
			snprintf(part, sizeof(part), "%d", id);
			km_cmd_num_or_dash(hi, e, sizeof(e));
			km_cmd_num_or_dash(hidden, h, sizeof(h));
			km_cli_table_row(tb, row);
		}
	}
	if (x->a->json)
		km_cli_json_arr_end(j);
}

/*
 * start --dry-run's report, per topic and partition: after a stop here (drill: lr holds where the
 * stop left it), a failback (lr: where the source's kmirrord stopped), or from scratch.
 */
static bool start_report(ctx *x, start_view *v)
{
	static const char *const hdr[] = {"TOPIC", "PARTITION", "START", "STOPPED-AT", "END-HERE", "HIDDEN"};
	const km_cli_args *a = x->a;
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
		return false;
	}
	for (size_t i = 0; i < v->ntopics; i++) {
		const km_last_mirrored_offsets_response_topic_result *tr = NULL;
		for (int32_t t = 0; t < v->lr.topics.count && !tr; t++)
			if (km_str_eq_c(v->lr.topics.items[t].name, v->topics[i]) && !v->lr.topics.items[t].error_code)
				tr = &v->lr.topics.items[t];
		if (a->json) {
			km_cli_json_obj(&j);
			km_cli_json_key(&j, "name");
			km_cli_json_str(&j, v->topics[i]);
			km_cli_json_key(&j, "failback");
			km_cli_json_bool(&j, tr != NULL && !v->drill[i]);
			km_cli_json_key(&j, "after_stop");
			km_cli_json_bool(&j, v->drill[i]);
		}
		if (!tr) {
			start_report_scratch(x, &j, &tb, v, i);
		} else {
			if (a->json) {
				km_cli_json_key(&j, "partitions");
				km_cli_json_arr(&j);
			}
			for (int32_t k = 0; k < tr->partitions.count; k++)
				start_report_partition(x, &j, &tb, v, i, &tr->partitions.items[k]);
			if (a->json)
				km_cli_json_arr_end(&j);
		}
		if (a->json)
			km_cli_json_obj_end(&j);
	}
	if (a->json) {
		km_cli_json_arr_end(&j);
		km_cli_json_key(&j, "total_records_hidden");
		km_cli_json_int(&j, v->total);
		km_cli_json_obj_end(&j);
	} else {
		km_cli_table_print(&tb, x->out);
		km_cli_table_free(&tb);
		fprintf(x->out, "\nTotal: %lld records here would be hidden. Dry run: nothing was started.\n"
			"After a stop here, the start hides what was written here since the stop and mirrors on from "
			"where the stop left the topic (read that tail through kmirrord before, from STOPPED-AT on, to "
			"keep it). A failback keeps what is here below where the source's kmirrord stopped and mirrors "
			"from there; it compares the record before the stop point on both sides, and refuses a topic "
			"not mirrored from here. From scratch hides everything here; a topic that holds records no "
			"mirror here wrote is refused unless started with --adopt-existing.\n",
			(long long)v->total);
	}
	return true;
}

/* Whether topic is in mirror dm with every partition STOPPED: a start resumes it from where the stop left it. */
static bool stopped_here(const km_describe_mirrors_response_described_mirror *dm, const char *topic)
{
	for (int32_t t = 0; t < dm->topics.count; t++) {
		const km_describe_mirrors_response_described_topic *dt = &dm->topics.items[t];
		bool all = dt->partitions.count > 0;
		if (!km_str_eq_c(dt->name, topic))
			continue;
		for (int32_t k = 0; k < dt->partitions.count && all; k++)
			all = km_str_eq_c(dt->partitions.items[k].state, "STOPPED") && dt->partitions.items[k].mirrored_offset >= 0;
		return all;
	}
	return false;
}

/*
 * LastMirroredOffsets of the topics not stopped here, from the mirror's source (reached with
 * --command-config's settings). A plain Kafka source (no mirror RPCs) leaves lr empty: those
 * topics are mirrored from scratch. lr points into *resp, which the caller frees after its last use.
 */
static int source_last_mirrored(ctx *x, const char *source, char *const *topics, size_t ntopics, const bool *drill,
				km_last_mirrored_offsets_response *lr, void **resp)
{
	char **asked = km_arena_calloc(&x->arena, (ntopics + 1) * sizeof(*asked)), err[1024] = "";
	size_t n = 0;
	ctx y = *x;
	int rc = KM_CLI_EXIT_ERROR;

	if (!asked)
		return KM_CLI_EXIT_ERROR;
	for (size_t i = 0; i < ntopics; i++)
		if (!drill[i])
			asked[n++] = topics[i];
	y.resp = NULL;
	y.resp_len = 0;
	if (!(y.cc = km_cmd_connect(x->a, source, false, x->a->timeout_ms, x->err, err, sizeof(err), &rc))) {
		if (err[0])
			km_cmd_say_err(x, "the mirror's source: %s", err);
		return rc;
	}
	rc = ask_last_mirrored(x, &y, asked, n, lr) ? KM_CLI_EXIT_OK : KM_CLI_EXIT_ERROR;
	*resp = y.resp;
	km_cli_conn_free(y.cc);
	return rc;
}

/* The topics stopped here join lr, each partition at the offset the stop left it at (the describe's mirrored offset). */
static bool add_stop_points(ctx *x, const km_describe_mirrors_response_described_mirror *dm, char *const *topics,
			    size_t ntopics, const bool *drill, km_last_mirrored_offsets_response *lr)
{
	size_t nd = 0, k = 0;
	km_last_mirrored_offsets_response_topic_result *all;

	for (size_t i = 0; i < ntopics; i++)
		nd += drill[i];
	if (!nd)
		return true;
	if (!(all = km_arena_calloc(&x->arena, ((size_t)lr->topics.count + nd) * sizeof(*all))))
		return false;
	for (int32_t t = 0; t < lr->topics.count; t++)
		all[k++] = lr->topics.items[t];
	for (size_t i = 0; i < ntopics; i++)
		for (int32_t t = 0; drill[i] && t < dm->topics.count; t++) {
			const km_describe_mirrors_response_described_topic *dt = &dm->topics.items[t];
			km_last_mirrored_offsets_response_partition_result *pr;
			if (!km_str_eq_c(dt->name, topics[i]))
				continue;
			if (!(pr = km_arena_calloc(&x->arena, (size_t)dt->partitions.count * sizeof(*pr))))
				return false;
			km_last_mirrored_offsets_response_topic_result_init(&all[k]);
			all[k].name = km_str_c(topics[i]);
			for (int32_t q = 0; q < dt->partitions.count; q++) {
				km_last_mirrored_offsets_response_partition_result_init(&pr[q]);
				pr[q].partition_index = dt->partitions.items[q].partition_index;
				pr[q].state = km_str_c("STOPPED");
				pr[q].last_mirrored_offset = dt->partitions.items[q].mirrored_offset;
				pr[q].last_mirrored_epoch = -1;
			}
			all[k].partitions.items = pr;
			all[k++].partitions.count = dt->partitions.count;
		}
	lr->topics.items = all;
	lr->topics.count = (int32_t)k;
	return true;
}

/*
 * start --dry-run: what a start would do with each partition. A topic of the mirror STOPPED here
 * resumes where the stop left it, M: what was written here since (up to the end ListOffsets gives
 * here) is hidden. For the others the mirror's source is asked LastMirroredOffsets; where it is a
 * kmirrord that mirrored the topic from here and stopped at M, the start keeps what is here below
 * M and hides the rest; elsewhere it mirrors from scratch.
 */
static int cmd_start_dry_run(ctx *x, char *const *topics, size_t ntopics)
{
	const km_cli_args *a = x->a;
	km_describe_mirrors_response resp;
	start_view v = {.topics = topics, .ntopics = ntopics};
	char source[1024] = "";
	int rc = km_cmd_describe_one(x, NULL, 0, &resp, &v.dm);
	size_t nsrc = 0;
	/* The answers the report reads (each decoded in place): the next call would free them. */
	void *kept[3] = {x->resp, NULL, NULL};

	x->resp = NULL;
	if (rc != KM_CLI_EXIT_OK)
		goto out;
	rc = KM_CLI_EXIT_ERROR;
	if (!(v.drill = km_arena_calloc(&x->arena, (ntopics + 1) * sizeof(*v.drill))))
		goto out;
	source_of(v.dm, source, sizeof(source));
	for (size_t i = 0; i < ntopics; i++)
		if (!(v.drill[i] = stopped_here(v.dm, topics[i])))
			nsrc++;
	km_last_mirrored_offsets_response_init(&v.lr);
	v.lr.topics.count = 0;
	if (nsrc && !*source) {
		km_cmd_say_err(x, "mirror %s has no bootstrap.servers", a->mirror);
		goto out;
	}
	if (nsrc && (rc = source_last_mirrored(x, source, topics, ntopics, v.drill, &v.lr, &kept[1])) != KM_CLI_EXIT_OK)
		goto out;
	rc = KM_CLI_EXIT_ERROR;
	if (!add_stop_points(x, v.dm, topics, ntopics, v.drill, &v.lr) || !metadata_here(x, topics, ntopics, &v.md))
		goto out;
	kept[2] = x->resp;
	x->resp = NULL;
	if (offsets_here(x, &v.md, -2, &v.starts) && offsets_here(x, &v.md, -1, &v.ends) && start_report(x, &v))
		rc = KM_CLI_EXIT_OK;
out:
	for (size_t i = 0; i < sizeof(kept) / sizeof(*kept); i++)
		free(kept[i]);
	return rc;
}

/*
 * What start's --topics-regex chooses from: the source's topics (a start creates them here; on a
 * fresh destination none exists yet) and the destination's. A source that cannot be reached from
 * here leaves the destination's, with a warning.
 */
static int start_candidates(ctx *x, km_str **names, size_t *n)
{
	km_describe_mirrors_response resp;
	const km_describe_mirrors_response_described_mirror *dm;
	km_str *src = NULL, *dst = NULL, *all;
	size_t nsrc = 0, ndst = 0;
	char source[1024] = "", why[1024] = "";
	int rc = km_cmd_describe_one(x, NULL, 0, &resp, &dm);

	if (rc != KM_CLI_EXIT_OK)
		return rc;
	source_of(dm, source, sizeof(source)); /* copied: the next call frees the describe's answer */
	if (*source && !km_cmd_source_topics(x, source, &src, &nsrc, why, sizeof(why)))
		fprintf(x->err, "kmirror: start: the mirror's source (%s) cannot be reached from here (%s): "
			"--topics-regex matches the destination's topics only\n", source, why);
	if (!destination_topics(x, &dst, &ndst))
		return KM_CLI_EXIT_ERROR;
	if (!(all = km_arena_calloc(&x->arena, (nsrc + ndst + 1) * sizeof(*all))))
		return KM_CLI_EXIT_ERROR;
	for (size_t i = 0; i < nsrc; i++)
		all[(*n)++] = src[i];
	for (size_t i = 0; i < ndst; i++) {
		bool seen = false;
		for (size_t j = 0; j < nsrc && !seen; j++)
			seen = km_str_eq(src[j], dst[i]);
		if (!seen)
			all[(*n)++] = dst[i];
	}
	*names = all;
	return KM_CLI_EXIT_OK;
}

/* The topics --topics-regex selects: among the source's and the destination's for start, the mirror's otherwise. */
static int topics_by_regex(ctx *x, char *const **topics, size_t *ntopics)
{
	const km_cli_args *a = x->a;
	km_str *names = NULL;
	size_t n = 0;
	char **sel;
	if (a->cmd == KM_CLI_CMD_START) {
		int rc = start_candidates(x, &names, &n);
		if (rc != KM_CLI_EXIT_OK)
			return rc;
	} else {
		int rc = km_cmd_mirror_topics(x, &names, &n);
		if (rc != KM_CLI_EXIT_OK)
			return rc;
	}
	if (!km_cmd_regex_select(x, a->topics_regex, names, n, &sel, ntopics))
		return KM_CLI_EXIT_ERROR;
	if (*ntopics == 0) {
		km_cmd_say_err(x, "no %s topic matches --topics-regex '%s'",
			       a->cmd == KM_CLI_CMD_START ? "source or destination" : "mirror", a->topics_regex);
		return KM_CLI_EXIT_ERROR;
	}
	*topics = sel;
	return KM_CLI_EXIT_OK;
}

/* Each topic's result of start, stop, promote, pause or resume: JSON, or a table. */
static bool print_results(ctx *x, const topic_result *res, size_t nres, const char *done_word)
{
	const km_cli_args *a = x->a;

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
			km_cmd_json_error(&j, res[i].error_code, res[i].error_message);
			km_cli_json_obj_end(&j);
		}
		km_cli_json_arr_end(&j);
		km_cli_json_obj_end(&j);
	} else {
		static const char *const hdr[] = {"TOPIC", "RESULT", "MESSAGE"};
		km_cli_table t;
		if (!km_cli_table_init(&t, sizeof(hdr) / sizeof(hdr[0]), hdr))
			return false;
		for (size_t i = 0; i < nres; i++) {
			char name[512], m[1024];
			const char *row[] = {name, res[i].error_code ? km_err_name(res[i].error_code) : done_word,
					     res[i].error_code ? m : NULL};
			snprintf(name, sizeof(name), "%.*s", (int)res[i].name.len, res[i].name.p);
			km_cmd_message_of(res[i].error_code, res[i].error_message, m, sizeof(m));
			km_cli_table_row(&t, row);
		}
		km_cli_table_print(&t, x->out);
		km_cli_table_free(&t);
	}
	return true;
}

int km_cmd_topics(ctx *x)
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
	if ((v = km_cmd_version_of(x, key)) < 0)
		return KM_CLI_EXIT_ERROR;
	if (a->topics_regex) {
		int rc = topics_by_regex(x, &topics, &ntopics);
		if (rc != KM_CLI_EXIT_OK)
			return rc;
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
	case KM_CLI_CMD_START: BUILD_TOPICS_REQUEST(km_start_mirror_topics, &w, v, a->mirror, topics, ntopics,
									   m_.adopt_existing = a->adopt_existing);
		break;
	case KM_CLI_CMD_STOP:
	case KM_CLI_CMD_PROMOTE: BUILD_TOPICS_REQUEST(km_stop_mirror_topics, &w, v, a->mirror, topics, ntopics, (void)0); break;
	case KM_CLI_CMD_PAUSE: BUILD_TOPICS_REQUEST(km_pause_mirror_topics, &w, v, a->mirror, topics, ntopics, (void)0); break;
	default: BUILD_TOPICS_REQUEST(km_resume_mirror_topics, &w, v, a->mirror, topics, ntopics, (void)0); break;
	}
	if (!km_cmd_call(x, key, &w, v, &r))
		return KM_CLI_EXIT_ERROR;
	switch (a->cmd) {
	case KM_CLI_CMD_START: DECODE_TOPICS_RESPONSE(km_start_mirror_topics, key, &r, v, ec, em, res, nres); break;
	case KM_CLI_CMD_STOP:
	case KM_CLI_CMD_PROMOTE: DECODE_TOPICS_RESPONSE(km_stop_mirror_topics, key, &r, v, ec, em, res, nres); break;
	case KM_CLI_CMD_PAUSE: DECODE_TOPICS_RESPONSE(km_pause_mirror_topics, key, &r, v, ec, em, res, nres); break;
	default: DECODE_TOPICS_RESPONSE(km_resume_mirror_topics, key, &r, v, ec, em, res, nres); break;
	}
	if (ec)
		return km_cmd_top_error(x, ec, em);
	for (size_t i = 0; i < nres; i++)
		failed += res[i].error_code != 0;
	for (size_t i = 0; i < nres; i++)
		if (res[i].error_code) {
			/* One line for the first refusal; every topic's result is on stdout. */
			char m[1024];
			km_cmd_message_of(res[i].error_code, res[i].error_message, m, sizeof(m));
			if (nres > 1)
				km_cmd_say_err(x, "%zu of %zu topics refused; first: %s: %s", failed, nres,
					km_err_name(res[i].error_code), m);
			else
				km_cmd_say_err(x, "%s: %s", km_err_name(res[i].error_code), m);
			break;
		}
	if (!print_results(x, res, nres, done_word))
		return KM_CLI_EXIT_ERROR;
	return failed ? KM_CLI_EXIT_ERROR : KM_CLI_EXIT_OK;
}
