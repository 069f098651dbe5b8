/*
 * libFuzzer harness: the mirror.name topic config (proxy/mirror_rpc.h, mirror_cfg.c).
 * IncrementalAlterConfigs and AlterConfigs requests split (mirror.name and the state topic kept
 * back, the rest forwarded), the broker's answer taken, the client's answer merged; DescribeConfigs
 * answers given their mirror.name entries; mirror and topic names checked.
 *
 * Input: an operation byte, a version byte, 3 bytes (the first picks the authorizing probe's
 * version; the rest unused, so every proxy harness starts alike), then for the config APIs a
 * 2-byte request length, the request body and the broker's response body; for names, names
 * separated by newlines (the version byte's low bit: mirror names rather than topic names).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/wire.h"
#include "proxy/mirror_rpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The guard: the state topic, and topics whose name starts with 'm' taken for mirror topics (their configs refused). */
static bool synced(void *arg, km_str topic, char *msg, size_t len)
{
	(void)arg;
	snprintf(msg, len, "mirror topic");
	return topic.len > 0 && topic.p[0] == 'm';
}

static const km_mcfg_guard guard = {KM_MIRROR_STATE_TOPIC_DEFAULT, synced, NULL, 44};

static void die(const char *what)
{
	fprintf(stderr, "fuzz_mirror_cfg: %s\n", what);
	abort();
}

/* Encode m with c at v, and the result must decode whole (into scratch, from a). */
static void round_trip(const km_api_codec *c, int16_t v, const void *m, km_arena *a, const char *what)
{
	void *back = malloc(c->struct_size);
	km_wr w;
	km_rd r;
	km_wr_init(&w);
	c->encode(&w, v, m);
	if (!km_wr_ok(&w))
		die(what);
	km_rd_init(&r, w.buf, w.len);
	c->init(back);
	if (c->decode(&r, v, back, a) != KM_OK || r.pos != r.len)
		die(what);
	km_wr_free(&w);
	free(back);
}

static bool decode(const km_api_codec *c, int16_t v, const uint8_t *p, size_t n, void *m, km_arena *a)
{
	km_rd r;
	km_rd_init(&r, p, n);
	c->init(m);
	return c->decode(&r, v, m, a) == KM_OK && r.pos == r.len;
}

static bool is_mirror_name(km_str s)
{
	return km_str_eq_c(s, KM_MIRROR_NAME_CONFIG);
}

static void iac(int16_t v, const uint8_t *q, size_t qlen, const uint8_t *p, size_t plen)
{
	const km_api_info *api = km_api_lookup(KM_API_INCREMENTAL_ALTER_CONFIGS);
	km_incremental_alter_configs_request in;
	km_incremental_alter_configs_response br, out;
	km_mcfg_split sp;
	km_arena a;

	km_arena_init(&a, 16 << 20);
	if (!decode(&api->request, v, q, qlen, &in, &a) || km_mcfg_split_iac(&in, &guard, &a, &sp) != KM_OK)
		goto out;
	if (sp.nres != (in.resources.count > 0 ? in.resources.count : 0))
		die("IncrementalAlterConfigs: the split lost resources");
	for (int32_t i = 0; i < sp.fwd.resources.count; i++) {
		const km_incremental_alter_configs_request_alter_configs_resource *r = &sp.fwd.resources.items[i];
		if (r->resource_type == KM_RESOURCE_TOPIC && km_str_eq_c(r->resource_name, KM_MIRROR_STATE_TOPIC_DEFAULT))
			die("IncrementalAlterConfigs: the state topic is forwarded");
		for (int32_t j = 0; r->resource_type == KM_RESOURCE_TOPIC && j < r->configs.count; j++)
			if (is_mirror_name(r->configs.items[j].name))
				die("IncrementalAlterConfigs: mirror.name is forwarded");
	}
	round_trip(&api->request, v, &sp.fwd, &a, "IncrementalAlterConfigs: the forwarded request does not decode");
	if (decode(&api->response, v, p, plen, &br, &a))
		(void)km_mcfg_take_iac(&sp, &br, false, &a);
	if (sp.nres > 0)
		km_mcfg_set(&sp, sp.nres - 1, 0, NULL, &a);
	if (km_mcfg_merge_iac(&in, &sp, &a, &out) != KM_OK)
		goto out;
	if (out.responses.count != sp.nres)
		die("IncrementalAlterConfigs: not one result per resource");
	round_trip(&api->response, v, &out, &a, "IncrementalAlterConfigs: the merged response does not decode");
out:
	km_arena_free(&a);
}

static void ac(int16_t v, int16_t probe_v, const uint8_t *q, size_t qlen, const uint8_t *p, size_t plen)
{
	const km_api_info *api = km_api_lookup(KM_API_ALTER_CONFIGS);
	const km_api_info *iapi = km_api_lookup(KM_API_INCREMENTAL_ALTER_CONFIGS);
	km_alter_configs_request in;
	km_alter_configs_response br, out;
	km_incremental_alter_configs_response ibr;
	km_mcfg_split sp;
	km_arena a;

	km_arena_init(&a, 16 << 20);
	if (!decode(&api->request, v, q, qlen, &in, &a) || km_mcfg_split_ac(&in, &guard, &a, &sp) != KM_OK)
		goto out;
	for (int32_t i = 0; i < sp.fwd_legacy.resources.count; i++) {
		const km_alter_configs_request_alter_configs_resource *r = &sp.fwd_legacy.resources.items[i];
		if (r->resource_type == KM_RESOURCE_TOPIC && km_str_eq_c(r->resource_name, KM_MIRROR_STATE_TOPIC_DEFAULT))
			die("AlterConfigs: the state topic is forwarded");
		for (int32_t j = 0; r->resource_type == KM_RESOURCE_TOPIC && j < r->configs.count; j++)
			if (is_mirror_name(r->configs.items[j].name))
				die("AlterConfigs: mirror.name is forwarded");
	}
	for (int32_t i = 0; i < sp.auth.resources.count; i++)
		if (sp.auth.resources.items[i].configs.count != 0 || !sp.auth.validate_only)
			die("AlterConfigs: the authorizing probe changes something");
	round_trip(&api->request, v, &sp.fwd_legacy, &a, "AlterConfigs: the forwarded request does not decode");
	round_trip(&iapi->request, probe_v, &sp.auth, &a, "AlterConfigs: the authorizing probe does not decode");
	if (decode(&api->response, v, p, plen, &br, &a))
		(void)km_mcfg_take_ac(&sp, &br, &a);
	if (decode(&iapi->response, probe_v, p, plen, &ibr, &a))
		(void)km_mcfg_take_iac(&sp, &ibr, true, &a);
	if (km_mcfg_merge_ac(&in, &sp, &a, &out) != KM_OK)
		goto out;
	if (out.responses.count != sp.nres)
		die("AlterConfigs: not one result per resource");
	round_trip(&api->response, v, &out, &a, "AlterConfigs: the merged response does not decode");
out:
	km_arena_free(&a);
}

/* A topic is a mirror topic when its name's length is even: "m", paused when it is a multiple of 4. */
static bool look(void *arg, km_str topic, char *value, size_t cap)
{
	(void)arg;
	if (topic.len <= 0 || topic.len % 2)
		return false;
	snprintf(value, cap, "%s", topic.len % 4 ? "m" : "m" KM_MIRROR_PAUSED_SUFFIX);
	return true;
}

static void describe(int16_t v, const uint8_t *q, size_t qlen, const uint8_t *p, size_t plen)
{
	const km_api_info *api = km_api_lookup(KM_API_DESCRIBE_CONFIGS);
	km_describe_configs_request in;
	km_describe_configs_response m;
	km_str *topics = NULL;
	size_t n = 0;
	int added = 0, before = 0;
	km_arena a;

	km_arena_init(&a, 16 << 20);
	if (!decode(&api->request, v, q, qlen, &in, &a) || !decode(&api->response, v, p, plen, &m, &a))
		goto out;
	if (in.resources.count > 0 && !(topics = km_arena_alloc(&a, (size_t)in.resources.count * sizeof(*topics))))
		goto out;
	for (int32_t i = 0; i < in.resources.count; i++)
		if (km_mcfg_describe_wants(&in.resources.items[i]))
			topics[n++] = in.resources.items[i].resource_name;
	for (int32_t i = 0; i < m.results.count; i++)
		before += m.results.items[i].configs.count > 0 ? m.results.items[i].configs.count : 0;
	if (km_mcfg_describe_add(&m, topics, n, v >= 1 && in.include_synonyms, look, NULL, &a, &added) != KM_OK)
		goto out;
	if (added < 0 || added > m.results.count)
		die("DescribeConfigs: more entries added than results");
	for (int32_t i = 0; i < m.results.count; i++)
		before -= m.results.items[i].configs.count > 0 ? m.results.items[i].configs.count : 0;
	if (-before != added)
		die("DescribeConfigs: the entries added are not the ones counted");
	round_trip(&api->response, v, &m, &a, "DescribeConfigs: the answer with mirror.name does not decode");
out:
	km_arena_free(&a);
}

static void names(const uint8_t *p, size_t n, bool mirror)
{
	km_str list[64];
	size_t k = 0, at = 0;
	char err[512];
	while (at <= n && k < 64) {
		const uint8_t *nl = memchr(p + at, '\n', n - at);
		size_t len = nl ? (size_t)(nl - (p + at)) : n - at;
		list[k++] = (km_str){(const char *)p + at, (int32_t)len};
		at += len + 1;
	}
	for (size_t i = 0; i < k; i++) {
		err[0] = '\0';
		if (km_mirror_check_name(list[i], mirror ? "mirror" : "topic", err, sizeof(err)) == KM_OK) {
			if (list[i].len <= 0 || list[i].len > 249)
				die("names: a name of that length passes");
			for (int32_t j = 0; j < list[i].len; j++)
				if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", list[i].p[j]) ||
				    !list[i].p[j])
					die("names: a name with a character Kafka refuses passes");
		} else {
			/* The reason never repeats a character the name may not hold (it goes into logs and answers). */
			for (const char *c = err; *c; c++)
				if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
					die("names: the refusal carries a control or non-ASCII byte");
		}
	}
	(void)km_mirror_check_names(list, k, mirror ? "mirror" : "topic", err, sizeof(err));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const int16_t keys[] = {KM_API_INCREMENTAL_ALTER_CONFIGS, KM_API_ALTER_CONFIGS, KM_API_DESCRIBE_CONFIGS};
	const km_api_info *api;
	const uint8_t *q;
	size_t qlen;
	int16_t v;
	int op;

	if (size < 5 || size > (1u << 20))
		return 0;
	op = data[0] % 4;
	if (op == 3) {
		names(data + 5, size - 5, data[1] & 1);
		return 0;
	}
	if (size < 7)
		return 0;
	api = km_api_lookup(keys[op]);
	v = (int16_t)(api->min_version + data[1] % (api->max_version - api->min_version + 1));
	qlen = km_be16(data + 5);
	q = data + 7;
	size -= 7;
	if (qlen > size)
		qlen = size;
	if (op == 0)
		iac(v, q, qlen, q + qlen, size - qlen);
	else if (op == 1)
		ac(v, (int16_t)(data[2] & 1), q, qlen, q + qlen, size - qlen); /* the probe: IncrementalAlterConfigs v0 or v1 */
	else
		describe(v, q, qlen, q + qlen, size - qlen);
	return 0;
}
