/* kmirror describe: the mirrors, their topics, partitions and metadata sync, as a table or JSON. */
#include <string.h>

#include "cli/commands.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/describe_mirrors_request.h"

/* ---- describe ---- */

/* DescribeMirrors of one mirror (or all when mirror is NULL), topics as given; resp decoded in x's arena. */
bool km_cmd_describe_call(ctx *x, const char *mirror, char *const *topics, size_t ntopics,
			  km_describe_mirrors_response *resp)
{
	int16_t v = km_cmd_version_of(x, KM_API_DESCRIBE_MIRRORS);
	km_describe_mirrors_request m;
	km_str name, *ts = NULL;

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
	return km_cmd_rpc(x, KM_API_DESCRIBE_MIRRORS, v, &m, resp);
}

/* Kafka shows topic ids as URL-safe base64 without padding (22 characters). */

/* A mirror at a glance: its partitions by state, its lag, the newest error (describe's first lines). */
typedef struct summary {
	int64_t parts, by_state[16], lag, lag_ms, topics, by_pattern;
	char states[16][24];
	size_t nstates;
	bool lag_time_unknown;
	const km_describe_mirrors_response_described_topic *err_topic;
	const km_describe_mirrors_response_described_partition *err; /* the newest partition error */
} summary;

static void summarize(const km_describe_mirrors_response_described_mirror *dm, summary *s)
{
	memset(s, 0, sizeof(*s));
	for (int32_t t = 0; t < dm->topics.count; t++) {
		const km_describe_mirrors_response_described_topic *dt = &dm->topics.items[t];
		s->topics++;
		s->by_pattern += dt->started_by_pattern;
		for (int32_t p = 0; p < dt->partitions.count; p++) {
			const km_describe_mirrors_response_described_partition *dp = &dt->partitions.items[p];
			size_t k = 0;
			char st[24];
			snprintf(st, sizeof(st), "%.*s", (int)dp->state.len, dp->state.p);
			while (k < s->nstates && strcmp(s->states[k], st))
				k++;
			if (k == s->nstates && k < sizeof(s->states) / sizeof(s->states[0]))
				snprintf(s->states[s->nstates++], sizeof(s->states[0]), "%s", st);
			if (k < s->nstates)
				s->by_state[k]++;
			s->parts++;
			if (dp->lag > 0)
				s->lag += dp->lag;
			if (dp->lag > 0 && dp->lag_time_ms < 0)
				s->lag_time_unknown = true;
			if (dp->lag_time_ms > s->lag_ms)
				s->lag_ms = dp->lag_time_ms;
			if (dp->last_error.len >= 0 && (!s->err || dp->last_error_time_ms > s->err->last_error_time_ms)) {
				s->err = dp;
				s->err_topic = dt;
			}
		}
	}
}

static void json_summary(km_cli_json *j, const summary *s)
{
	km_cli_json_key(j, "summary");
	km_cli_json_obj(j);
	km_cli_json_key(j, "topics");
	km_cli_json_int(j, s->topics);
	km_cli_json_key(j, "topics_started_by_pattern");
	km_cli_json_int(j, s->by_pattern);
	km_cli_json_key(j, "partitions");
	km_cli_json_int(j, s->parts);
	km_cli_json_key(j, "partitions_by_state");
	km_cli_json_obj(j);
	for (size_t k = 0; k < s->nstates; k++) {
		km_cli_json_key(j, s->states[k]);
		km_cli_json_int(j, s->by_state[k]);
	}
	km_cli_json_obj_end(j);
	km_cli_json_key(j, "lag_records");
	km_cli_json_int(j, s->lag);
	km_cli_json_key(j, "lag_seconds");
	if (s->lag_time_unknown)
		km_cli_json_null(j);
	else
		km_cli_json_double(j, (double)s->lag_ms / 1000.0);
	km_cli_json_key(j, "last_error");
	if (s->err) {
		km_cli_json_obj(j);
		km_cli_json_key(j, "topic");
		km_cli_json_strn(j, s->err_topic->name.p, s->err_topic->name.len);
		km_cli_json_key(j, "partition");
		km_cli_json_int(j, s->err->partition_index);
		km_cli_json_key(j, "message");
		km_cli_json_strn(j, s->err->last_error.p, s->err->last_error.len);
		km_cli_json_key(j, "time_ms");
		km_cli_json_int(j, s->err->last_error_time_ms);
		km_cli_json_obj_end(j);
	} else
		km_cli_json_null(j);
	km_cli_json_obj_end(j);
}

static void table_summary(FILE *out, const summary *s)
{
	fprintf(out, "Topics: %lld", (long long)s->topics);
	if (s->by_pattern)
		fprintf(out, " (%lld started by mirror.topics.include)", (long long)s->by_pattern);
	fprintf(out, "\nPartitions: %lld", (long long)s->parts);
	for (size_t k = 0; k < s->nstates; k++)
		fprintf(out, "%s%lld %s", k ? ", " : " (", (long long)s->by_state[k], s->states[k]);
	fprintf(out, "%s\nLag: %lld records", s->nstates ? ")" : "", (long long)s->lag);
	if (s->lag_time_unknown)
		fprintf(out, ", time not known (another kmirrord runs the mirror, or nothing is mirrored yet)\n");
	else
		fprintf(out, ", %.1f s\n", (double)s->lag_ms / 1000.0);
	if (s->err) {
		char at[32];
		km_cli_format_time(s->err->last_error_time_ms, at, sizeof(at));
		fprintf(out, "Last error: %.*s-%d: %.*s (%s)\n", (int)s->err_topic->name.len, s->err_topic->name.p,
			(int)s->err->partition_index, (int)s->err->last_error.len, s->err->last_error.p, at);
	} else {
		fprintf(out, "Last error: none\n");
	}
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
		km_cli_json_key(j, "scope");
		km_cli_json_strn(j, ds->scope.p, ds->scope.len);
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
		summary s;
		summarize(dm, &s);
		km_cli_json_key(&j, "name");
		km_cli_json_strn(&j, dm->mirror_name.p, dm->mirror_name.len);
		km_cli_json_key(&j, "error");
		km_cmd_json_error(&j, dm->error_code, dm->error_message);
		if (dm->error_code) {
			km_cli_json_key(&j, "summary");
			km_cli_json_null(&j);
		} else
			json_summary(&j, &s);
		km_cli_json_key(&j, "owner");
		if (dm->owner.len < 0)
			km_cli_json_null(&j);
		else
			km_cli_json_strn(&j, dm->owner.p, dm->owner.len);
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
			km_cli_json_obj(&j);
			km_cli_json_key(&j, "name");
			km_cli_json_strn(&j, dt->name.p, dt->name.len);
			km_cli_json_key(&j, "topic_id");
			km_cli_json_uuid(&j, &dt->topic_id);
			km_cli_json_key(&j, "source_topic_id");
			km_cli_json_uuid(&j, &dt->source_topic_id);
			km_cli_json_key(&j, "started_by");
			km_cli_json_str(&j, dt->started_by_pattern ? "pattern" : "operator");
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
				km_cli_json_key(&j, "lag_time_ms");
				km_cli_json_int(&j, dp->lag_time_ms);
				km_cli_json_key(&j, "skipped_records");
				km_cli_json_int(&j, dp->skipped_records);
				km_cli_json_key(&j, "records_hidden");
				km_cli_json_int(&j, dp->records_hidden);
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

void km_cmd_num_or_dash(int64_t v, char *buf, size_t len)
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
	static const char *const hdr[] = {"KIND", "SCOPE", "LAST-SYNC", "COMPARED", "CHANGES-LAST", "CHANGES-TOTAL",
					  "SKIPPED", "ERRORS", "LAST-ERROR"};
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
		char kind[64], scope[512], last[32], cmp[24], chl[24], cht[24], skip[24], errs[24], le[1024];
		const char *row[] = {kind, scope, last, cmp, chl, cht, skip, errs, le};
		snprintf(kind, sizeof(kind), "%.*s", (int)ds->kind.len, ds->kind.p);
		if (ds->scope.len < 0)
			snprintf(scope, sizeof(scope), "-"); /* a kmirrord that does not say */
		else
			snprintf(scope, sizeof(scope), "%.*s", (int)ds->scope.len, ds->scope.p);
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
						   "SKIPPED", "HIDDEN", "LAST-ERROR"};
		km_cli_table ct, pt;
		summary s;

		if (i > 0)
			fputc('\n', out);
		fprintf(out, "Mirror: %.*s\n", (int)dm->mirror_name.len, dm->mirror_name.p);
		if (dm->error_code) {
			char m[1024];
			km_cmd_message_of(dm->error_code, dm->error_message, m, sizeof(m));
			fprintf(out, "Error: %s: %s\n", km_err_name(dm->error_code), m);
			continue;
		}
		if (dm->owner.len >= 0)
			fprintf(out, "Run by: %.*s\n", (int)dm->owner.len, dm->owner.p);
		else
			fprintf(out, "Run by: not known to this kmirrord\n");
		summarize(dm, &s);
		table_summary(out, &s);
		fputc('\n', out);
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
				const char *row[] = {topic, "-", st, "-", "-", "-", "-", "-", "-", "-"};
				snprintf(st, sizeof(st), "%.*s", (int)dt->state.len, dt->state.p);
				km_cli_table_row(&pt, row);
			}
			for (int32_t p = 0; p < dt->partitions.count; p++) {
				const km_describe_mirrors_response_described_partition *dp = &dt->partitions.items[p];
				char part[16], st[64], since[32], end[24], mir[24], lag[24], skip[24], hid[24], le[1024];
				const char *row[] = {topic, part, st, since, end, mir, lag, skip, hid, le};
				snprintf(part, sizeof(part), "%d", dp->partition_index);
				snprintf(st, sizeof(st), "%.*s", (int)dp->state.len, dp->state.p);
				km_cli_format_time(dp->state_change_time_ms, since, sizeof(since));
				km_cmd_num_or_dash(dp->source_log_end_offset, end, sizeof(end));
				km_cmd_num_or_dash(dp->mirrored_offset, mir, sizeof(mir));
				km_cmd_num_or_dash(dp->lag, lag, sizeof(lag));
				snprintf(skip, sizeof(skip), "%lld", (long long)dp->skipped_records);
				snprintf(hid, sizeof(hid), "%lld", (long long)dp->records_hidden);
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

int km_cmd_describe(ctx *x)
{
	km_describe_mirrors_response resp;
	int rc = KM_CLI_EXIT_OK;

	if (!km_cmd_describe_call(x, x->a->mirror, x->a->topics, x->a->ntopics, &resp))
		return KM_CLI_EXIT_ERROR;
	if (resp.error_code)
		return km_cmd_top_error(x, resp.error_code, resp.error_message);
	/* A mirror's own error (an unknown name) fails the command; the others still print. */
	for (int32_t i = 0; i < resp.mirrors.count; i++) {
		const km_describe_mirrors_response_described_mirror *dm = &resp.mirrors.items[i];
		if (dm->error_code && rc == KM_CLI_EXIT_OK) {
			char m[1024];
			km_cmd_message_of(dm->error_code, dm->error_message, m, sizeof(m));
			km_cmd_say_err(x, "%s: %s", km_err_name(dm->error_code), m);
			rc = KM_CLI_EXIT_ERROR;
		}
	}
	if (resp.mirrors.count == 0 && !x->a->mirror && !x->a->json)
		fprintf(x->out, "No mirrors.\n");
	else
		km_cli_describe_print(x->out, &resp, x->a->json);
	return rc;
}
