/* kmirror last-mirrored-offsets and reverse: what a mirror copied, and mirroring back after a promote. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/last_mirrored_offsets_request.h"
#include "kmirror/msg/last_mirrored_offsets_response.h"

/* ---- last-mirrored-offsets ---- */

int km_cmd_last_offsets(ctx *x)
{
	const km_cli_args *a = x->a;
	int16_t v = km_cmd_version_of(x, KM_API_LAST_MIRRORED_OFFSETS);
	km_last_mirrored_offsets_request m;
	km_last_mirrored_offsets_request_topic_data *td = NULL;
	km_last_mirrored_offsets_response resp;
	size_t failed = 0;

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
	if (!km_cmd_rpc(x, KM_API_LAST_MIRRORED_OFFSETS, v, &m, &resp))
		return KM_CLI_EXIT_ERROR;
	if (resp.error_code)
		return km_cmd_top_error(x, resp.error_code, resp.error_message);
	for (int32_t i = 0; i < resp.topics.count; i++) {
		const km_last_mirrored_offsets_response_topic_result *t = &resp.topics.items[i];
		if (t->error_code && failed++ == 0) {
			char msg[1024];
			km_cmd_message_of(t->error_code, t->error_message, msg, sizeof(msg));
			km_cmd_say_err(x, "%s: %s", km_err_name(t->error_code), msg);
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
			km_cmd_json_error(&j, t->error_code, t->error_message);
			km_cli_json_key(&j, "source_topic_id");
			km_cli_json_uuid(&j, &t->source_topic_id);
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
				km_cmd_message_of(t->error_code, t->error_message, msg, sizeof(msg));
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
				km_cmd_num_or_dash(pr->last_mirrored_offset, off, sizeof(off));
				km_cmd_num_or_dash(pr->last_mirrored_epoch, ep, sizeof(ep));
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

	if ((rc = km_cmd_describe_one(x, topics, ntopics, &resp, &dm)) != KM_CLI_EXIT_OK)
		return -1;
	for (int32_t t = 0; t < dm->topics.count; t++)
		for (int32_t p = 0; p < dm->topics.items[t].partitions.count; p++)
			if (!km_str_eq_c(dm->topics.items[t].partitions.items[p].state, "STOPPED"))
				return 0;
	return 1;
}

int km_cmd_reverse(ctx *x)
{
	const km_cli_args *a = x->a;
	char *const *topics = a->topics;
	size_t ntopics = a->ntopics;
	km_cli_args sub;
	km_cli_kvs cfg = {0};
	FILE *quiet;
	int rc, st;
	bool absent;
	int64_t t0;

	if (a->topics_regex) {
		km_str *names = NULL;
		size_t n = 0;
		char **sel;
		if ((rc = km_cmd_mirror_topics(x, &names, &n)) != KM_CLI_EXIT_OK)
			return rc;
		if (!km_cmd_regex_select(x, a->topics_regex, names, n, &sel, &ntopics))
			return KM_CLI_EXIT_ERROR;
		if (!ntopics) {
			km_cmd_say_err(x, "no mirror topic matches --topics-regex '%s'", a->topics_regex);
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
			km_cmd_say_err(x, "reverse: stopped at the promote of mirror %s here; nothing was done on %s", a->mirror,
				a->peer_bootstrap);
			return rc;
		}
		t0 = km_mono_ms();
		while ((st = all_stopped(x, topics, ntopics)) == 0) {
			if (km_mono_ms() - t0 > a->wait_ms) {
				km_cmd_say_err(x, "reverse: the topics are not all STOPPED here after %lld ms; nothing was done on "
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
			km_cmd_say_err(x, "reverse: the topics are STOPPED here (failed over); mirror %s on %s could not be "
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
			km_cmd_say_err(x, "reverse: the topics are STOPPED here (failed over); creating mirror %s on %s failed: "
				"create it there by hand, then start it", a->peer_mirror, a->peer_bootstrap);
			return rc;
		}
	}
	/* 3. Start it on the same topics: a failback start mirrors only the delta. */
	sub.cmd = KM_CLI_CMD_START;
	sub.topics = (char **)topics;
	sub.ntopics = ntopics;
	if ((rc = km_cli_run(&sub, x->out, x->err)) != KM_CLI_EXIT_OK)
		km_cmd_say_err(x, "reverse: the topics are STOPPED here and mirror %s exists on %s; its start failed: start it "
			"there by hand", a->peer_mirror, a->peer_bootstrap);
	return rc;
}
