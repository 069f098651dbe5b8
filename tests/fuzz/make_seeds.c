/*
 * Seeds for the proxy-level harnesses, from the frames captured from real Kafka (tests/data/golden)
 * re-framed as each harness reads its input, and re-encoded at the versions no capture has.
 * Usage: tests/fuzz/make_seeds NAME OUTDIR [GOLDEN_DIR]; then tests/fuzz/run-fuzzer NAME 0 --seed OUTDIR
 * merges those that add coverage into tests/fuzz/corpus/NAME.
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/arena.h"
#include "kmirror/fetch.h"
#include "kmirror/msg/alter_configs_request.h"
#include "kmirror/msg/alter_configs_response.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/incremental_alter_configs_request.h"
#include "kmirror/msg/incremental_alter_configs_response.h"
#include "kmirror/msg/request_header.h"
#include "kmirror/msg/response_header.h"
#include "kmirror/wire.h"
#include "kmirror/msg/mirror_state_mirror_value.h"
#include "kmirror/msg/mirror_state_partition_value.h"
#include "proxy/mirror_rpc.h"
#include "state/state_int.h"

#ifndef KM_GOLDEN_DIR
#define KM_GOLDEN_DIR "tests/data/golden"
#endif

static const char *outdir;
static unsigned nwritten;

/* One seed file: a harness prefix, then the body. */
static void put_seed(const char *tag, const uint8_t *pre, size_t plen, const uint8_t *body, size_t blen)
{
	char path[4096];
	FILE *f;
	snprintf(path, sizeof(path), "%s/seed-%s-%04u", outdir, tag, nwritten++);
	if (!(f = fopen(path, "wb")) || (plen && fwrite(pre, 1, plen, f) != plen) ||
	    (blen && fwrite(body, 1, blen, f) != blen)) {
		perror(path);
		exit(1);
	}
	fclose(f);
}

static uint8_t *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	long n;
	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
		*len = (size_t)n;
	} else {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}

/*
 * Every captured exchange of one api key: cb(version, request frame, its length, response frame,
 * its length); the response NULL when none was captured (acks=0, a long poll cut short).
 */
typedef void (*pair_cb)(int16_t v, const uint8_t *rq, size_t rqlen, const uint8_t *rs, size_t rslen);

static void each_golden(const char *golden, int key, pair_cb cb)
{
	DIR *top = opendir(golden), *sd;
	struct dirent *s, *e;
	if (!top) {
		perror(golden);
		exit(1);
	}
	while ((s = readdir(top))) {
		char sub[2048];
		if (s->d_name[0] == '.')
			continue;
		snprintf(sub, sizeof(sub), "%s/%s", golden, s->d_name);
		if (!(sd = opendir(sub)))
			continue;
		while ((e = readdir(sd))) {
			int seq, k, v;
			char path[4096];
			uint8_t *rq, *rs;
			size_t rqlen, rslen = 0;
			if (sscanf(e->d_name, "%d-%d-v%d-req.bin", &seq, &k, &v) != 3 || k != key)
				continue;
			snprintf(path, sizeof(path), "%s/%s", sub, e->d_name);
			if (!(rq = read_all(path, &rqlen)))
				continue;
			snprintf(path, sizeof(path), "%s/%04d-%d-v%d-resp.bin", sub, seq, k, v);
			rs = read_all(path, &rslen);
			cb((int16_t)v, rq, rqlen, rs, rslen);
			free(rq);
			free(rs);
		}
		closedir(sd);
	}
	closedir(top);
}

/* Where a request's body starts (after its header), or 0 when the header does not decode. */
static size_t request_body(int16_t key, int16_t v, const uint8_t *rq, size_t len)
{
	km_request_header h;
	km_arena a;
	km_rd r;
	size_t at = 0;
	km_arena_init(&a, 1 << 20);
	km_rd_init(&r, rq, len);
	km_request_header_init(&h);
	if (km_request_header_decode(&r, (int16_t)km_api_request_header_version(key, v), &h, &a) == KM_OK)
		at = r.pos;
	km_arena_free(&a);
	return at;
}

/* Where a response's body starts (after its header), or 0 when the header does not decode. */
static size_t response_body(int16_t key, int16_t v, const uint8_t *rs, size_t len)
{
	km_response_header h;
	km_arena a;
	km_rd r;
	size_t at = 0;
	km_arena_init(&a, 1 << 20);
	km_rd_init(&r, rs, len);
	km_response_header_init(&h);
	if (km_response_header_decode(&r, (int16_t)km_api_response_header_version(key, v), &h, &a) == KM_OK)
		at = r.pos;
	km_arena_free(&a);
	return at;
}

/* ---- fetch: [version][3 split bytes][frame after its size prefix] ---- */

static void fetch_seed(int16_t v, const uint8_t *frame, size_t len)
{
	static const uint8_t splits[][3] = {{0x00, 1, 2}, {0x1f, 3, 4}, {0xff, 0, 0}};
	for (size_t i = 0; i < sizeof(splits) / sizeof(splits[0]); i++) {
		uint8_t pre[4] = {(uint8_t)(v - KM_FETCH_RESPONSE_MIN_VERSION), splits[i][0], splits[i][1], splits[i][2]};
		put_seed("fetch", pre, 4, frame, len);
	}
}

/* A captured response, and the same response re-encoded at every version the codec knows. */
static void fetch_golden(int16_t v, const uint8_t *rq, size_t rqlen, const uint8_t *frame, size_t len)
{
	km_response_header h;
	km_fetch_response m;
	km_arena a;
	km_rd r;

	(void)rq;
	(void)rqlen;
	if (!frame)
		return;
	fetch_seed(v, frame, len);
	km_arena_init(&a, 16 << 20);
	km_rd_init(&r, frame, len);
	km_response_header_init(&h);
	km_fetch_response_init(&m);
	if (km_response_header_decode(&r, v >= 12 ? 1 : 0, &h, &a) == KM_OK && km_fetch_response_decode(&r, v, &m, &a) == KM_OK) {
		for (int16_t to = KM_FETCH_RESPONSE_MIN_VERSION; to <= KM_FETCH_RESPONSE_MAX_VERSION; to++) {
			km_wr w;
			if (to == v)
				continue;
			km_wr_init(&w);
			km_response_header_encode(&w, to >= 12 ? 1 : 0, &h);
			km_fetch_response_encode(&w, to, &m);
			if (km_wr_ok(&w))
				fetch_seed(to, w.buf, w.len);
			km_wr_free(&w);
		}
	}
	km_arena_free(&a);
}

/* ---- offsets: [op][version byte][3 split bytes][2-byte request length][request body][response] ---- */

enum { OFF_FETCH, OFF_LIST_OFFSETS, OFF_DELETE_RECORDS, OFF_LEADER_EPOCH, OFF_PRODUCE, OFF_DESCRIBE_PRODUCERS,
       OFF_SHARE_FETCH_REQ, OFF_SHARE_ACK_REQ, OFF_SHARE_FETCH_RESP, OFF_MAP };

static int16_t off_key;
static int off_op;

static void off_seed(int op, int16_t key, int16_t v, const uint8_t *rq, size_t rqlen, const uint8_t *rs, size_t rslen)
{
	const km_api_info *api = km_api_lookup(key);
	uint8_t pre[7] = {(uint8_t)op, (uint8_t)(v - api->min_version), 0x0f, 5, 6};
	uint8_t *buf = malloc(rqlen + rslen + 1);
	size_t plen = 5;
	if (rqlen > 0xffff)
		rqlen = 0xffff;
	if (op < OFF_SHARE_FETCH_REQ) {
		km_put_be16(pre + 5, (uint16_t)rqlen);
		plen = 7;
	}
	memcpy(buf, rq, rqlen);
	memcpy(buf + rqlen, rs, rslen);
	put_seed("offsets", pre, plen, buf, rqlen + rslen);
	free(buf);
}

/* An exchange as the op wants it: the request body, and the response (Fetch: the frame after its size; others: the body). */
static void off_golden(int16_t v, const uint8_t *rq, size_t rqlen, const uint8_t *rs, size_t rslen)
{
	size_t qb = request_body(off_key, v, rq, rqlen), sb = rs ? response_body(off_key, v, rs, rslen) : 0;
	if (!qb || (rs && !sb))
		return;
	rq += qb;
	rqlen -= qb;
	if (rs && off_op != OFF_FETCH) {
		rs += sb;
		rslen -= sb;
	}
	switch (off_op) {
	case OFF_SHARE_FETCH_REQ:
	case OFF_SHARE_ACK_REQ:
		off_seed(off_op, off_key, v, rq, rqlen, NULL, 0);
		if (off_key == KM_API_SHARE_FETCH && rs)
			off_seed(OFF_SHARE_FETCH_RESP, off_key, v, rs, rslen, NULL, 0);
		break;
	case OFF_PRODUCE:
	case OFF_LEADER_EPOCH:
		if (rs)
			off_seed(off_op, off_key, v, NULL, 0, rs, rslen);
		break;
	default:
		off_seed(off_op, off_key, v, rq, rqlen, rs, rslen);
		break;
	}
}

static void offsets_seeds(const char *golden)
{
	static const struct {
		int op;
		int16_t key;
	} ops[] = {{OFF_FETCH, KM_API_FETCH}, {OFF_LIST_OFFSETS, KM_API_LIST_OFFSETS},
		   {OFF_DELETE_RECORDS, KM_API_DELETE_RECORDS}, {OFF_LEADER_EPOCH, KM_API_OFFSET_FOR_LEADER_EPOCH},
		   {OFF_PRODUCE, KM_API_PRODUCE}, {OFF_SHARE_FETCH_REQ, KM_API_SHARE_FETCH},
		   {OFF_SHARE_ACK_REQ, KM_API_SHARE_ACKNOWLEDGE}};
	/* The map's own translations: a map, then offsets (here 130 and 140 in map 0, 5 and 20 in map 1). */
	static const uint8_t maps[][17] = {
		{0, 0, 0, 0, 0, 0, 0, 0, 130, 0, 0, 0, 0, 0, 0, 0, 140},
		{1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 20},
	};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		off_op = ops[i].op;
		off_key = ops[i].key;
		each_golden(golden, off_key, off_golden);
	}
	for (size_t i = 0; i < sizeof(maps) / sizeof(maps[0]); i++) {
		uint8_t pre[5] = {OFF_MAP, 0, 0x0f, 1, 2};
		put_seed("offsets", pre, 5, maps[i], sizeof(maps[i]));
	}
}

/* ---- readonly: [op][version byte][3 split bytes] then Produce: [2-byte length][request frame][response frame];
 * admin: [key byte][2-byte length][request body][response body] ---- */

static int16_t ro_key;

static void ro_produce(int16_t v, const uint8_t *rq, size_t rqlen, const uint8_t *rs, size_t rslen)
{
	uint8_t pre[7] = {0, (uint8_t)(v - 3), 0x1f, 7, 8};
	uint8_t *buf = malloc(rqlen + rslen + 1);
	if (v < 3 || rqlen > 0xffff) {
		free(buf);
		return;
	}
	km_put_be16(pre + 5, (uint16_t)rqlen);
	memcpy(buf, rq, rqlen);
	if (rs)
		memcpy(buf + rqlen, rs, rslen);
	put_seed("readonly", pre, sizeof(pre), buf, rqlen + (rs ? rslen : 0));
	free(buf);
}

static void ro_admin(int16_t v, const uint8_t *rq, size_t rqlen, const uint8_t *rs, size_t rslen)
{
	static const int16_t keys[] = {KM_API_DELETE_RECORDS, KM_API_DELETE_TOPICS, KM_API_CREATE_PARTITIONS,
				       KM_API_CREATE_TOPICS};
	const km_api_info *api = km_api_lookup(ro_key);
	size_t qb = request_body(ro_key, v, rq, rqlen), sb = rs ? response_body(ro_key, v, rs, rslen) : 0;
	uint8_t pre[8] = {1, (uint8_t)(v - api->min_version), 0x1f, 9, 10};
	uint8_t *buf;
	if (!qb || !rs || !sb || rqlen - qb > 0xffff)
		return;
	for (uint8_t k = 0; k < 4; k++)
		if (keys[k] == ro_key)
			pre[5] = k;
	km_put_be16(pre + 6, (uint16_t)(rqlen - qb));
	buf = malloc(rqlen + rslen);
	memcpy(buf, rq + qb, rqlen - qb);
	memcpy(buf + rqlen - qb, rs + sb, rslen - sb);
	put_seed("readonly", pre, sizeof(pre), buf, rqlen - qb + rslen - sb);
	free(buf);
}

static void readonly_seeds(const char *golden)
{
	static const int16_t keys[] = {KM_API_DELETE_RECORDS, KM_API_DELETE_TOPICS, KM_API_CREATE_PARTITIONS,
				       KM_API_CREATE_TOPICS};
	/* The refusal log: topic "ab" DeleteTopics twice 1 ms apart, then 20 s later. */
	static const uint8_t log[] = {2, 'a', 'b', 2, 0, 1, 2, 'a', 'b', 2, 0x4e, 0x20};
	uint8_t pre[5] = {2, 0, 0, 0, 0};
	each_golden(golden, KM_API_PRODUCE, ro_produce);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		ro_key = keys[i];
		each_golden(golden, ro_key, ro_admin);
	}
	put_seed("readonly", pre, sizeof(pre), log, sizeof(log));
}

/* ---- rewrite: [rewriter][version byte][3 split bytes][body] (Produce: the frame; tags: the section) ---- */

static int rw_op;
static int16_t rw_key;

static void rw_seed(int op, uint8_t vb, const uint8_t *p, size_t n)
{
	uint8_t pre[5] = {(uint8_t)op, vb, 0x2f, 11, 12};
	put_seed("rewrite", pre, sizeof(pre), p, n);
}

static void rw_golden(int16_t v, const uint8_t *rq, size_t rqlen, const uint8_t *rs, size_t rslen)
{
	const km_api_info *api = km_api_lookup(rw_key);
	size_t sb;
	(void)rq;
	(void)rqlen;
	if (!rs || !(sb = response_body(rw_key, v, rs, rslen)))
		return;
	if (rw_key == KM_API_PRODUCE) {
		if (v >= 9)
			rw_seed(rw_op, (uint8_t)(v - 9), rs, rslen);
		return;
	}
	if (rw_key == KM_API_FETCH) {
		/* Its top-level tags, where the walker finds them (NodeEndpoints from v16). */
		struct evbuffer *b = evbuffer_new();
		uint8_t pre[4];
		km_fetch_walk w;
		km_fw_event ev;
		km_put_be32(pre, (uint32_t)rslen);
		evbuffer_add(b, pre, 4);
		evbuffer_add(b, rs, rslen);
		km_fetch_walk_init(&w, v, 4 + rslen);
		while ((ev = km_fetch_walk_next(&w, b, 0)) == KM_FW_PARTITION || ev == KM_FW_BATCH)
			;
		if (ev == KM_FW_END && v >= 12)
			rw_seed(rw_op, 0, rs + w.pos - 4, 4 + rslen - w.pos);
		evbuffer_free(b);
		return;
	}
	rw_seed(rw_op, (uint8_t)(v - api->min_version), rs + sb, rslen - sb);
}

static void rewrite_seeds(const char *golden)
{
	static const int16_t keys[] = {KM_API_METADATA, KM_API_FIND_COORDINATOR, KM_API_DESCRIBE_CLUSTER,
				       KM_API_DESCRIBE_CONFIGS, KM_API_DESCRIBE_QUORUM, KM_API_SHARE_FETCH,
				       KM_API_SHARE_ACKNOWLEDGE, KM_API_API_VERSIONS, KM_API_PRODUCE, KM_API_FETCH};
	static const char *const values[] = {"PLAINTEXT://broker-1.internal:9092", "10.0.0.1:9093", "[::1]:9092",
					     "compact,delete"};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		rw_op = (int)i;
		rw_key = keys[i];
		each_golden(golden, rw_key, rw_golden);
	}
	for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++)
		rw_seed(10, 0, (const uint8_t *)values[i], strlen(values[i]));
}

/* ---- mirror_cfg: [op][version byte][3 bytes][2-byte request length][request body][response body] ---- */

static void cfg_seed(int op, uint8_t vb, const km_wr *q, const km_wr *r)
{
	uint8_t pre[7] = {(uint8_t)op, vb, 0, 0, 0};
	uint8_t *buf = malloc(q->len + r->len + 1);
	km_put_be16(pre + 5, (uint16_t)q->len);
	memcpy(buf, q->buf, q->len);
	memcpy(buf + q->len, r->buf, r->len);
	put_seed("mirror_cfg", pre, sizeof(pre), buf, q->len + r->len);
	free(buf);
}

static void cfg_describe(int16_t v, const uint8_t *rq, size_t rqlen, const uint8_t *rs, size_t rslen)
{
	const km_api_info *api = km_api_lookup(KM_API_DESCRIBE_CONFIGS);
	size_t qb = request_body(KM_API_DESCRIBE_CONFIGS, v, rq, rqlen), sb;
	km_wr q, r;
	if (!qb || !rs || !(sb = response_body(KM_API_DESCRIBE_CONFIGS, v, rs, rslen)))
		return;
	km_wr_init(&q);
	km_wr_init(&r);
	km_wr_raw(&q, rq + qb, rqlen - qb);
	km_wr_raw(&r, rs + sb, rslen - sb);
	cfg_seed(2, (uint8_t)(v - api->min_version), &q, &r);
	km_wr_free(&q);
	km_wr_free(&r);
}

/*
 * Requests with every case of the split: a mirror.name SET, a pause, a DELETE among other configs,
 * the state topic, a broker resource; the broker's answer for what was forwarded.
 */
static void mirror_cfg_seeds(const char *golden)
{
	static const char *const topics[] = {"orders", "__mirror_state", "audit", "clicks"};
	static const char *const values[] = {"m", "x", "m.paused", NULL};
	const km_api_info *iapi = km_api_lookup(KM_API_INCREMENTAL_ALTER_CONFIGS);
	const km_api_info *aapi = km_api_lookup(KM_API_ALTER_CONFIGS);
	(void)golden;
	for (int16_t v = iapi->min_version; v <= iapi->max_version; v++) {
		km_incremental_alter_configs_request rq;
		km_incremental_alter_configs_request_alter_configs_resource res[5];
		km_incremental_alter_configs_request_alterable_config cfg[5][2];
		km_incremental_alter_configs_response rs;
		km_incremental_alter_configs_response_alter_configs_resource_response out[5];
		km_wr q, r;
		km_incremental_alter_configs_request_init(&rq);
		km_incremental_alter_configs_response_init(&rs);
		for (int i = 0; i < 5; i++) {
			km_incremental_alter_configs_request_alter_configs_resource_init(&res[i]);
			km_incremental_alter_configs_response_alter_configs_resource_response_init(&out[i]);
			for (int j = 0; j < 2; j++)
				km_incremental_alter_configs_request_alterable_config_init(&cfg[i][j]);
			res[i].resource_type = i < 4 ? KM_RESOURCE_TOPIC : KM_RESOURCE_BROKER;
			res[i].resource_name = km_str_c(i < 4 ? topics[i] : "1");
			cfg[i][0].name = km_str_c(i == 4 ? "log.cleaner.threads" : "mirror.name");
			cfg[i][0].config_operation = i == 3 ? 1 : 0;
			cfg[i][0].value = i < 4 && values[i] ? km_str_c(values[i]) : i == 4 ? km_str_c("2") : KM_STR_NULL;
			cfg[i][1].name = km_str_c("retention.ms");
			cfg[i][1].value = km_str_c("1000");
			res[i].configs.count = i == 3 ? 2 : 1;
			res[i].configs.items = cfg[i];
			out[i].resource_type = res[i].resource_type;
			out[i].resource_name = res[i].resource_name;
			out[i].error_code = i == 2 ? 29 : 0;
			out[i].error_message = i == 2 ? km_str_c("denied") : KM_STR_NULL;
		}
		rq.resources.count = 5;
		rq.resources.items = res;
		rs.responses.count = 5;
		rs.responses.items = out;
		km_wr_init(&q);
		km_wr_init(&r);
		km_incremental_alter_configs_request_encode(&q, v, &rq);
		km_incremental_alter_configs_response_encode(&r, v, &rs);
		if (km_wr_ok(&q) && km_wr_ok(&r))
			cfg_seed(0, (uint8_t)(v - iapi->min_version), &q, &r);
		km_wr_free(&q);
		km_wr_free(&r);
	}
	for (int16_t v = aapi->min_version; v <= aapi->max_version; v++) {
		km_alter_configs_request rq;
		km_alter_configs_request_alter_configs_resource res[4];
		km_alter_configs_request_alterable_config cfg[4][2];
		km_alter_configs_response rs;
		km_alter_configs_response_alter_configs_resource_response out[4];
		km_wr q, r;
		km_alter_configs_request_init(&rq);
		km_alter_configs_response_init(&rs);
		for (int i = 0; i < 4; i++) {
			km_alter_configs_request_alter_configs_resource_init(&res[i]);
			km_alter_configs_response_alter_configs_resource_response_init(&out[i]);
			for (int j = 0; j < 2; j++)
				km_alter_configs_request_alterable_config_init(&cfg[i][j]);
			res[i].resource_type = KM_RESOURCE_TOPIC;
			res[i].resource_name = km_str_c(topics[i]);
			cfg[i][0].name = km_str_c("mirror.name");
			cfg[i][0].value = values[i] ? km_str_c(values[i]) : KM_STR_NULL;
			cfg[i][1].name = km_str_c("retention.ms");
			cfg[i][1].value = km_str_c("1000");
			res[i].configs.count = i == 2 ? 2 : 1;
			res[i].configs.items = cfg[i];
			out[i].resource_type = res[i].resource_type;
			out[i].resource_name = res[i].resource_name;
		}
		rq.resources.count = 4;
		rq.resources.items = res;
		rs.responses.count = 4;
		rs.responses.items = out;
		km_wr_init(&q);
		km_wr_init(&r);
		km_alter_configs_request_encode(&q, v, &rq);
		km_alter_configs_response_encode(&r, v, &rs);
		if (km_wr_ok(&q) && km_wr_ok(&r))
			cfg_seed(1, (uint8_t)(v - aapi->min_version), &q, &r);
		km_wr_free(&q);
		km_wr_free(&r);
	}
	each_golden(golden, KM_API_DESCRIBE_CONFIGS, cfg_describe);
	{
		static const char names[] = "orders\n.\n..\nm.paused\nbad name\nm\norders";
		uint8_t pre[5] = {3, 1, 0, 0, 0};
		put_seed("mirror_cfg", pre, sizeof(pre), (const uint8_t *)names, sizeof(names) - 1);
	}
}

/* ---- state: records, each [2-byte key length][key][2-byte value length, 0xffff: tombstone][value] ---- */

static void st_rec(km_wr *out, const km_state_key *k, const km_wr *val)
{
	km_wr kw;
	km_wr_init(&kw);
	km_state_key_encode(&kw, k);
	km_wr_i16(out, (int16_t)kw.len);
	km_wr_raw(out, kw.buf, kw.len);
	km_wr_i16(out, val ? (int16_t)val->len : -1);
	if (val)
		km_wr_raw(out, val->buf, val->len);
	km_wr_free(&kw);
}

static void st_mirror(km_wr *out, const char *name, const char *const *cfg, size_t n)
{
	static const uint8_t key[KM_STATE_KEY_BYTES] = {
		0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42,
		0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42};
	km_state_key k = {.type = KM_STATE_REC_MIRROR, .mirror = km_str_c(name)};
	km_mirror_state_mirror_value v;
	km_mirror_state_mirror_value_stored_config c[8];
	uint8_t *sealed[8] = {NULL};
	km_wr w;
	km_mirror_state_mirror_value_init(&v);
	v.mirror_name = km_str_c(name);
	v.created_time_ms = 1700000000000;
	v.modified_time_ms = 1700000000001;
	for (size_t i = 0; i < n && i < 8; i++) {
		const char *eq = strchr(cfg[i], '=');
		size_t slen;
		km_mirror_state_mirror_value_stored_config_init(&c[i]);
		c[i].name = (km_str){cfg[i], (int32_t)(eq - cfg[i])};
		c[i].value = km_str_c(eq + 1);
		c[i].sealed = KM_BYTES_NULL;
		if (!strncmp(cfg[i], "sasl.password", 13) && km_state_seal(key, "sasl.password", eq + 1, &sealed[i], &slen) == KM_OK) {
			c[i].value = KM_STR_NULL;
			c[i].sealed = (km_bytes){sealed[i], (int32_t)slen};
		}
	}
	v.configs.count = (int32_t)n;
	v.configs.items = c;
	km_wr_init(&w);
	km_wr_i16(&w, 0);
	km_mirror_state_mirror_value_encode(&w, 0, &v);
	st_rec(out, &k, &w);
	km_wr_free(&w);
	for (size_t i = 0; i < 8; i++)
		free(sealed[i]);
}

static void st_part(km_wr *out, const char *mirror, const char *topic, int32_t part, int8_t state, uint8_t id, bool tomb)
{
	km_state_key k = {.type = KM_STATE_REC_PARTITION, .mirror = km_str_c(mirror), .topic = km_str_c(topic),
			  .partition = part};
	km_mirror_state_partition_value v;
	km_wr w;
	km_mirror_state_partition_value_init(&v);
	v.state = state;
	memset(v.topic_id.b, id, 16);
	v.state_change_time_ms = 1700000000000;
	v.last_mirrored_offset = 41;
	v.last_mirrored_epoch = 3;
	v.last_error = state == KM_MP_FAILED ? km_str_c("source topic deleted") : KM_STR_NULL;
	km_wr_init(&w);
	km_wr_i16(&w, 0);
	km_mirror_state_partition_value_encode(&w, 0, &v);
	st_rec(out, &k, tomb ? NULL : &w);
	km_wr_free(&w);
}

static void st_run(km_wr *out, const char *mirror, const char *topic, int32_t part, int64_t logical, int64_t physical,
		   int64_t prev, uint8_t flags)
{
	km_state_key k = {.type = KM_STATE_REC_RUN, .mirror = km_str_c(mirror), .topic = km_str_c(topic),
			  .partition = part, .logical = logical};
	km_wr w;
	km_wr_init(&w);
	if (physical >= 0)
		(void)km_state_run_value_encode(&w, physical, prev, flags);
	st_rec(out, &k, physical >= 0 ? &w : NULL);
	km_wr_free(&w);
}

static void state_seeds(const char *golden)
{
	static const char *const cfg1[] = {"bootstrap.servers=src-1:9092,src-2:9092", "mirror.acl.include=TOPIC;orders.*",
					   "mirror.fetch.max.bytes=2048", "mirror.groups.include=orders.*,audit",
					   "sasl.password=secret", "security.protocol=SASL_SSL"};
	static const char *const cfg2[] = {"bootstrap.servers=other:9092", "mirror.start.offset=latest",
					   "mirror.topics.include=clicks|views"};
	km_wr w;
	(void)golden;
	/* One mirror, its topic's partitions in three states, the offset map of one. */
	km_wr_init(&w);
	st_mirror(&w, "m1", cfg1, 6);
	st_part(&w, "m1", "orders", 0, KM_MP_MIRRORING, 1, false);
	st_part(&w, "m1", "orders", 1, KM_MP_STOPPED, 1, false);
	st_part(&w, "m1", "orders", 2, KM_MP_PAUSED, 1, false);
	st_run(&w, "m1", "orders", 0, 0, 100, -1, 0);
	st_run(&w, "m1", "orders", 0, 50, 200, 40, KM_OFFRUN_LOG_APPEND_TIME);
	put_seed("state", NULL, 0, w.buf, w.len);
	/* The same in reverse order (runs before their partition, partitions before their mirror), and tombstones. */
	km_wr_free(&w);
	km_wr_init(&w);
	st_run(&w, "m1", "orders", 0, 50, 200, 40, KM_OFFRUN_FENCE);
	st_part(&w, "m1", "orders", 0, KM_MP_FAILED, 1, false);
	st_mirror(&w, "m1", cfg1, 6);
	st_part(&w, "m1", "orders", 1, KM_MP_PREPARING, 1, false);
	st_run(&w, "m1", "orders", 1, 10, 20, 5, 0);
	st_run(&w, "m1", "orders", 1, 10, -1, 0, 0);
	st_part(&w, "m1", "orders", 1, 0, 1, true);
	put_seed("state", NULL, 0, w.buf, w.len);
	/* Two mirrors, one topic name in both, a deleted mirror. */
	km_wr_free(&w);
	km_wr_init(&w);
	st_mirror(&w, "m1", cfg1, 2);
	st_mirror(&w, "m2", cfg2, 3);
	st_part(&w, "m1", "orders", 0, KM_MP_MIRRORING, 1, false);
	st_part(&w, "m2", "orders", 0, KM_MP_STOPPING, 2, false);
	st_part(&w, "m2", "clicks", 3, KM_MP_PAUSING, 3, false);
	st_run(&w, "m2", "clicks", 3, 1000, 10, 900, 0);
	st_run(&w, "m2", "clicks", 3, 5000, 100, 1500, 0);
	{
		km_state_key k = {.type = KM_STATE_REC_MIRROR, .mirror = km_str_c("gone")};
		st_mirror(&w, "gone", cfg2, 1);
		st_part(&w, "gone", "views", 0, KM_MP_MIRRORING, 4, false);
		st_rec(&w, &k, NULL);
	}
	put_seed("state", NULL, 0, w.buf, w.len);
	km_wr_free(&w);
}

/* ---- admin: [3 split bytes][body]; config: the file; props: [mode][text] ---- */

static void text_seeds(const char *name, const uint8_t *pre, size_t plen, const char *const *texts, size_t n)
{
	for (size_t i = 0; i < n; i++)
		put_seed(name, pre, plen, (const uint8_t *)texts[i], strlen(texts[i]));
}

static void admin_seeds(void)
{
	static const char *const bodies[] = {"10.0.0.1:9092,10.0.0.2:9092\n", "kafka-a:9092 kafka-b:9093", "[::1]:9092",
					     "[fe80::1%eth0]:19092,\r\n", "broker:0", "  ,host:65535,", "no-port"};
	static const uint8_t pre[3] = {0x03, 1, 2};
	text_seeds("admin", pre, sizeof(pre), bodies, sizeof(bodies) / sizeof(bodies[0]));
}

static void config_seeds(const char *top)
{
	static const char *const files[] = {
		"listen = 0.0.0.0:9092\nadvertised_host = proxy.example\nupstream = a:9092,b:9092\n"
		"broker_port_base = 19000\nbroker_port_count = 10\nlog_level = debug\n",
		"# comment\n\nupstream_tls = yes\nupstream_tls_ca_file = \"/etc/ca.pem\"\nupstream_sasl_mechanism = "
		"SCRAM-SHA-512\nupstream_sasl_username = u\nupstream_sasl_password = p\nhttp_listen = [::1]:8080\n",
		"tls_cert_file = c.pem\ntls_key_file = k.pem\ntls_client_auth = required\nadvertised_host = \"\"\n",
		"mirror_state_topic = __mirror_state\nmirror_state_partitions = 3\nmax_frame_bytes = 104857600\n"};
	char path[4096];
	uint8_t *b;
	size_t n;
	text_seeds("config", NULL, 0, files, sizeof(files) / sizeof(files[0]));
	snprintf(path, sizeof(path), "%s/../../../conf/kmirrord.conf", top);
	if ((b = read_all(path, &n))) {
		put_seed("config", NULL, 0, b, n);
		free(b);
	}
}

static void props_seeds(void)
{
	static const char *const props[] = {
		"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.jaas.config=org.apache.kafka.common."
		"security.scram.ScramLoginModule required username=\"admin\" password=\"a\\\"b\";\n"
		"ssl.ca.location=/etc/ca.pem\n",
		"# tool properties\nsecurity.protocol : SASL_PLAINTEXT\nsasl.mechanism PLAIN\nsasl.username=u\n"
		"sasl.password=p\\\n   ass\nclient.id=cli\\u00e9\nrequest.timeout.ms=1000\n",
		"security.protocol=SSL\nssl.certificate.location=c.pem\nssl.key.location=k.pem\n"
		"ssl.endpoint.identification.algorithm=\nssl.truststore.location=t.jks\n"};
	static const char *const jaas[] = {
		"org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=\"p\";",
		"ScramLoginModule optional username=bare password=\"q\\\\\" extra=1;",
		"com.example.Other required;"};
	static const uint8_t p0[1] = {0}, p1[1] = {1};
	text_seeds("props", p0, 1, props, sizeof(props) / sizeof(props[0]));
	text_seeds("props", p1, 1, jaas, sizeof(jaas) / sizeof(jaas[0]));
}

int main(int argc, char **argv)
{
	const char *golden = argc > 3 ? argv[3] : KM_GOLDEN_DIR;
	if (argc < 3) {
		fprintf(stderr, "usage: %s NAME OUTDIR [GOLDEN_DIR]\n", argv[0]);
		return 2;
	}
	outdir = argv[2];
	if (!strcmp(argv[1], "fetch")) {
		each_golden(golden, KM_API_FETCH, fetch_golden);
	} else if (!strcmp(argv[1], "readonly")) {
		readonly_seeds(golden);
	} else if (!strcmp(argv[1], "rewrite")) {
		rewrite_seeds(golden);
	} else if (!strcmp(argv[1], "mirror_cfg")) {
		mirror_cfg_seeds(golden);
	} else if (!strcmp(argv[1], "state")) {
		state_seeds(golden);
	} else if (!strcmp(argv[1], "admin")) {
		admin_seeds();
	} else if (!strcmp(argv[1], "config")) {
		config_seeds(golden);
	} else if (!strcmp(argv[1], "props")) {
		props_seeds();
	} else if (!strcmp(argv[1], "offsets")) {
		offsets_seeds(golden);
	} else {
		fprintf(stderr, "make_seeds: no seeds for %s\n", argv[1]);
		return 2;
	}
	printf("make_seeds %s: %u seeds in %s\n", argv[1], nwritten, outdir);
	return 0;
}
