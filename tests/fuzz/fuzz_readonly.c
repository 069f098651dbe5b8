/*
 * libFuzzer harness: the read-only hooks' pure parts (proxy/readonly.h). A Produce request in a
 * client's input of random chains walked in place with a lookup that refuses some topics, the walk
 * compared with a walk of the same frame in one piece and with the generated decoder, the request
 * rewritten without its refused partitions (referencing the input's chains, which are freed
 * before the result is read) and the broker's answer merged; DeleteRecords, DeleteTopics,
 * CreatePartitions and CreateTopics split and merged; the refusal log's rate limit.
 *
 * Input: an operation byte, a version byte, 3 bytes seeding the piece sizes (fuzz_split.h), then
 *   Produce: a 2-byte request length, the request frame (header and body, after its size prefix),
 *     the broker's response frame (after its size prefix);
 *   admin: a key byte, a 2-byte request length, the request body, the broker's response body;
 *   log: (topic length byte, topic, op byte, 2-byte time step) entries.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_split.h"
#include "kmirror/api.h"
#include "kmirror/msg/produce_request.h"
#include "kmirror/msg/response_header.h"
#include "kmirror/wire.h"
#include "proxy/readonly.h"
#include "proxy/rewrite.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what)
{
	fprintf(stderr, "fuzz_readonly: %s\n", what);
	abort();
}

/*
 * The lookup: the state topic is refused whole; a topic whose name's length (or id's first byte)
 * is 0 modulo 3 is read-only on every partition, 1 modulo 3 on odd partitions; the rest are
 * writable. So the names of captured frames meet refusals too.
 */
static bool fake_active(void *arg)
{
	(void)arg;
	return true;
}

static void fake_check(void *arg, km_str name, const km_uuid *id, int32_t partition, km_ro_op op, km_ro_verdict *v)
{
	unsigned k = id ? id->b[0] % 3u : name.len >= 0 ? (unsigned)name.len % 3u : 2u;
	(void)arg;
	v->code = KM_OK;
	if (!id && name.len >= 0 && km_str_eq_c(name, "__mirror_state")) {
		v->code = KM_KAFKA_TOPIC_AUTHORIZATION_FAILED;
		snprintf(v->message, sizeof(v->message), "__mirror_state is written, deleted and configured only by kmirrord");
		return;
	}
	if (op == KM_RO_CREATE_TOPIC)
		return;
	if (k == 0 || (k == 1 && partition >= 0 && partition % 2 == 1) || (k == 1 && partition < 0)) {
		v->code = KM_MIRROR_READ_ONLY_TOPIC;
		snprintf(v->message, sizeof(v->message), "topic %.*s is read-only", name.len > 0 ? name.len : 0,
			 name.len > 0 ? name.p : "");
		snprintf(v->name, sizeof(v->name), "%.*s", name.len > 0 ? name.len : 0, name.len > 0 ? name.p : "");
	}
}

static const km_ro_lookup LK = {fake_active, fake_check, NULL};

static km_rewrite_ctx rewrite_ctx(void)
{
	return (km_rewrite_ctx){.host = "proxy.local", .port_base = 19000, .port_count = 100};
}

/* Two plans of the same frame agree on every offset and verdict. */
static void same_plan(const km_ro_produce *a, const km_ro_produce *b)
{
	if (!a || !b) {
		if (a != b)
			die("Produce: the walk in pieces and in one piece disagree on refusing");
		return;
	}
	if (a->ntopics != b->ntopics || a->nparts != b->nparts || a->nrefused != b->nrefused || a->acks != b->acks ||
	    a->head_end != b->head_end || a->topics_end != b->topics_end)
		die("Produce: the plans differ");
	for (int32_t i = 0; i < a->ntopics; i++) {
		const km_ro_topic *x = &a->topics[i], *y = &b->topics[i];
		if (!km_str_eq(x->name, y->name) || memcmp(x->id.b, y->id.b, 16) != 0 || x->start != y->start ||
		    x->head_end != y->head_end || x->parts_end != y->parts_end || x->end != y->end || x->nparts != y->nparts)
			die("Produce: a topic differs between the plans");
		for (int32_t j = 0; j < x->nparts; j++)
			if (x->parts[j].index != y->parts[j].index || x->parts[j].start != y->parts[j].start ||
			    x->parts[j].end != y->parts[j].end || x->parts[j].code != y->parts[j].code)
				die("Produce: a partition differs between the plans");
	}
}

/* The request as the session holds it: its size prefix, the frame in chains, the next request's first bytes. */
static struct evbuffer *input_of(const uint8_t *frame, size_t len, km_fuzz_rng *g)
{
	static const uint8_t next[8] = {0, 0, 0, 99, 0, 0, 0, 9};
	struct evbuffer *in = evbuffer_new();
	uint8_t pre[4];
	km_put_be32(pre, (uint32_t)len);
	km_fuzz_add_chain(in, pre, 4);
	km_fuzz_add_split(in, g, frame, len);
	km_fuzz_add_chain(in, next, sizeof(next));
	return in;
}

/* Decode a request body (after its header) of key at v: whether it decodes whole. */
static bool decodes(int16_t key, int16_t v, bool request, const uint8_t *p, size_t n)
{
	const km_api_info *api = km_api_lookup(key);
	const km_api_codec *c = request ? &api->request : &api->response;
	void *m = malloc(c->struct_size);
	km_arena a;
	km_rd r;
	bool ok;
	km_arena_init(&a, 16 << 20);
	km_rd_init(&r, p, n);
	c->init(m);
	ok = c->decode(&r, v, m, &a) == KM_OK && r.pos == r.len;
	km_arena_free(&a);
	free(m);
	return ok;
}

/* Where the body of a Produce request frame starts, or 0 (a header that does not parse). */
static size_t produce_body(const uint8_t *frame, size_t len, int16_t v)
{
	km_req_header h;
	if (km_net_parse_request_header(frame, len, km_api_request_header_version(KM_API_PRODUCE, v), &h) != KM_OK)
		return 0;
	return h.body_offset;
}

static void produce(int16_t v, const uint8_t *p, size_t n, km_fuzz_rng *g)
{
	km_req_header h = {.api_key = KM_API_PRODUCE, .api_version = v};
	km_ro_produce *pl = NULL, *flat = NULL;
	struct evbuffer *in, *one, *out;
	km_rewrite_ctx rw = rewrite_ctx();
	const uint8_t *frame, *resp;
	size_t flen, rlen, body;
	bool whole;
	km_err rc;

	if (n < 2)
		return;
	flen = km_be16(p);
	if (flen > n - 2)
		flen = n - 2;
	frame = p + 2;
	resp = frame + flen;
	rlen = n - 2 - flen;
	body = produce_body(frame, flen, v);
	whole = body && decodes(KM_API_PRODUCE, v, true, frame + body, flen - body);

	in = input_of(frame, flen, g);
	rc = km_ro_produce_walk(in, 4, flen, &h, &LK, &pl);
	/* The same frame in one piece: the same plan. */
	one = evbuffer_new();
	evbuffer_add(one, frame, flen);
	if (km_ro_produce_walk(one, 0, flen, &h, &LK, &flat) != rc)
		die("Produce: the walk in pieces and in one piece disagree");
	same_plan(pl, flat);
	km_ro_produce_free(flat);
	evbuffer_free(one);
	if (whole && rc != KM_OK)
		die("Produce: the decoder accepts what the walk refuses");
	if (rc != KM_OK || !pl) {
		evbuffer_free(in);
		return;
	}
	if (pl->nrefused == 0 || pl->nrefused > pl->nparts)
		die("Produce: a plan without a refusal");

	/* The rewritten request references the input's chains: free the input before reading it. */
	out = evbuffer_new();
	{
		km_ro_keeper *k = km_ro_keeper_new(in);
		rc = km_ro_produce_rewrite(pl, in, 4, out, k);
		km_ro_keeper_release(k);
	}
	evbuffer_drain(in, 4 + flen);
	evbuffer_free(in);
	if (rc != KM_OK)
		die("Produce: a walked request does not rewrite");
	{
		size_t olen = evbuffer_get_length(out);
		uint8_t *o = evbuffer_pullup(out, -1);
		size_t ob = o ? produce_body(o, olen, v) : 0;
		if (whole && (!ob || !decodes(KM_API_PRODUCE, v, true, o + ob, olen - ob)))
			die("Produce: the rewritten request does not decode");
	}
	evbuffer_free(out);

	/* The client's answer: the refusals merged with the broker's response (or alone). */
	{
		km_response_header rh;
		km_arena a;
		km_rd r;
		km_wr w;
		uint8_t *rf = malloc(4 + rlen);
		struct evbuffer *rb = evbuffer_new();
		size_t tags_off = 4 + rlen, body_off = 0;

		km_put_be32(rf, (uint32_t)rlen);
		memcpy(rf + 4, resp, rlen);
		km_arena_init(&a, 1 << 20);
		km_rd_init(&r, rf + 4, rlen);
		km_response_header_init(&rh);
		if (km_response_header_decode(&r, v >= 9 ? 1 : 0, &rh, &a) == KM_OK)
			body_off = 4 + r.pos;
		km_arena_free(&a);
		evbuffer_add(rb, rf, 4 + rlen);
		km_wr_init(&w);
		if (body_off && (v < 9 || km_rewrite_produce_top_tags(rb, 0, 4 + rlen, v, &tags_off) == KM_OK)) {
			rc = km_ro_produce_merge(pl, rf + body_off, 4 + rlen - body_off, v >= 9 ? rf + tags_off : NULL,
						 4 + rlen - tags_off, &rw, &w);
			if (rc == KM_OK && km_wr_ok(&w) && !decodes(KM_API_PRODUCE, v, false, w.buf, w.len))
				die("Produce: the merged response does not decode");
		}
		km_wr_free(&w);
		km_wr_init(&w);
		if (km_ro_produce_merge(pl, NULL, 0, NULL, 0, NULL, &w) != KM_OK || !km_wr_ok(&w) ||
		    !decodes(KM_API_PRODUCE, v, false, w.buf, w.len))
			die("Produce: the answer of refusals alone does not decode");
		km_wr_free(&w);
		evbuffer_free(rb);
		free(rf);
	}
	km_ro_produce_free(pl);
}

static void admin(int16_t key, int16_t v, const uint8_t *p, size_t n)
{
	km_ro_admin *ad = NULL;
	size_t qlen;
	km_wr fwd, w;
	km_err rc;

	if (n < 2)
		return;
	qlen = km_be16(p);
	if (qlen > n - 2)
		qlen = n - 2;
	p += 2;
	n -= 2;
	km_wr_init(&fwd);
	rc = km_ro_admin_split(key, v, p, qlen, &LK, &ad, &fwd);
	if (rc == KM_OK && !decodes(key, v, true, p, qlen))
		die("admin: the split accepts what the decoder refuses");
	if (rc != KM_OK || !ad) {
		if (ad)
			die("admin: a failed split left a plan");
		km_wr_free(&fwd);
		return;
	}
	if (fwd.len && !decodes(key, v, true, fwd.buf, fwd.len))
		die("admin: the forwarded request does not decode");
	km_wr_init(&w);
	rc = km_ro_admin_merge(ad, fwd.len ? p + qlen : NULL, fwd.len ? n - qlen : 0, &w);
	if (rc == KM_OK && (!km_wr_ok(&w) || !decodes(key, v, false, w.buf, w.len)))
		die("admin: the merged response does not decode");
	km_wr_free(&w);
	km_wr_free(&fwd);
	km_ro_admin_free(ad);
}

/* The refusal log's rate limit: a topic and op logged again no sooner than the interval. */
static void log_limit(const uint8_t *p, size_t n)
{
	static uint64_t now = 1000000;
	size_t at = 0;
	while (at + 1 <= n) {
		size_t tl = p[at] % 32;
		uint32_t sup;
		km_str topic;
		km_ro_op op;
		if (at + 1 + tl + 3 > n)
			break;
		topic = (km_str){(const char *)p + at + 1, (int32_t)tl};
		op = (km_ro_op)(p[at + 1 + tl] % (KM_RO_CREATE_TOPIC + 1));
		now += km_be16(p + at + 2 + tl);
		if (km_ro_log_allow(topic, op, now, &sup) && km_ro_log_allow(topic, op, now, &sup))
			die("log: the same topic and op logged twice at once");
		at += 1 + tl + 3;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const int16_t admin_keys[] = {KM_API_DELETE_RECORDS, KM_API_DELETE_TOPICS, KM_API_CREATE_PARTITIONS,
					     KM_API_CREATE_TOPICS};
	const km_api_info *api;
	km_fuzz_rng g;
	int16_t key, v;

	if (size < 5 || size > (1u << 20))
		return 0;
	km_fuzz_rng_init(&g, data + 2);
	switch (data[0] % 3) {
	case 0:
		/* The versions the proxy serves Produce at (3-13: no v0-2, whose header has no TransactionalId). */
		v = (int16_t)(3 + data[1] % 11);
		produce(v, data + 5, size - 5, &g);
		break;
	case 1:
		if (size < 6)
			return 0;
		key = admin_keys[data[5] % 4];
		api = km_api_lookup(key);
		v = (int16_t)(api->min_version + data[1] % (api->max_version - api->min_version + 1));
		admin(key, v, data + 6, size - 6);
		break;
	default:
		log_limit(data + 5, size - 5);
		break;
	}
	return 0;
}
