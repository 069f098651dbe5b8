/*
 * libFuzzer harness: offset translation on mirror topics (proxy/offsets.h, proxy/share_offsets.h)
 * over fixed offset maps: requests logical -> physical, whole responses physical -> logical, Fetch
 * responses patched as they stream in chains of random sizes (the walk with the offsets hooks, as
 * the session runs them), share group acknowledgements and ShareFetch records, and the map's own
 * translations of any offset.
 *
 * Input: an operation byte, a version byte, 3 bytes seeding the piece sizes (fuzz_split.h), then
 * the operation's bytes: for a request and its response, a 2-byte request length, the request body
 * and the response (a Fetch response frame after its size prefix; other responses: the body).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_split.h"
#include "kmirror/api.h"
#include "kmirror/fetch.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/offmap.h"
#include "kmirror/wire.h"
#include "proxy/offsets.h"
#include "proxy/share_offsets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * The maps, one per partition index (modulo their number) of the mirror topics: two runs around a
 * hole with the tail set, the second LogAppendTime (as the unit tests have it); an open run
 * without a tail stored above its logical offsets; runs stored below theirs, a fence, where
 * mirroring began before the first; no run with a tail; no run and no tail; runs near the top of
 * the offset range.
 */
static km_offrun runs_a[] = {{0, 100, -1, 0}, {50, 200, 40, KM_OFFRUN_LOG_APPEND_TIME}};
static km_offrun runs_b[] = {{10, 5000, -1, 0}};
static km_offrun runs_c[] = {{1000, 10, 900, 0}, {5000, 100, 1500, KM_OFFRUN_FENCE}, {6000, 200, 5050, 0}};
static km_offrun runs_f[] = {{0, INT64_MAX - 1000, -1, 0}, {INT64_MAX - 100, 5, INT64_MAX - 200, 0}};
static km_offrun runs_g[] = {{INT64_MAX - 10, 0, -1, KM_OFFRUN_LOG_APPEND_TIME}};
static km_offmap maps[] = {
	{.runs = runs_a, .n = 2, .cap = 2, .tail_physical = 300, .tail_logical = 160, .open_txn_logical = -1},
	{.runs = runs_b, .n = 1, .cap = 1, .tail_physical = -1, .tail_logical = -1, .open_txn_logical = -1},
	{.runs = runs_c, .n = 3, .cap = 3, .tail_physical = 400, .tail_logical = 6150, .open_txn_logical = 6100},
	{.runs = NULL, .n = 0, .cap = 0, .tail_physical = 70, .tail_logical = 20, .open_txn_logical = -1},
	{.runs = NULL, .n = 0, .cap = 0, .tail_physical = -1, .tail_logical = -1, .open_txn_logical = -1},
	{.runs = runs_f, .n = 2, .cap = 2, .tail_physical = -1, .tail_logical = -1, .open_txn_logical = -1},
	{.runs = runs_g, .n = 1, .cap = 1, .tail_physical = -1, .tail_logical = -1, .open_txn_logical = -1},
};
#define NMAPS (sizeof(maps) / sizeof(maps[0]))

/*
 * Which topics are mirror topics: by the name's length, or the id's first byte, modulo 4: 0 and 1
 * are two mirror topics (each partition with a map, the second taking the maps in another order),
 * 2 a topic with no map, 3 not a mirror topic. So the names and ids of captured frames reach every
 * case too.
 */
static const char TOPICS[3] = {'m', 'n', 'p'};

static bool fake_active(void *arg)
{
	(void)arg;
	return true;
}

static const void *fake_topic(void *arg, km_str name, const km_uuid *id)
{
	unsigned k = id ? id->b[0] % 4u : name.len >= 0 ? (unsigned)name.len % 4u : 3u;
	(void)arg;
	return k < 3 ? &TOPICS[k] : NULL;
}

static const km_offmap *fake_map(void *arg, const void *topic, int32_t partition)
{
	(void)arg;
	if (topic == &TOPICS[0])
		return &maps[(uint32_t)partition % NMAPS];
	if (topic == &TOPICS[1])
		return &maps[((uint32_t)partition + 3) % NMAPS];
	return NULL;
}

static const km_off_lookup LK = {fake_active, fake_topic, fake_map, NULL};

static void die(const char *what)
{
	fprintf(stderr, "fuzz_offsets: %s\n", what);
	abort();
}

/* A version of key within the codec's range, from a byte. */
static int16_t version_of(int16_t key, uint8_t b)
{
	const km_api_info *api = km_api_lookup(key);
	return (int16_t)(api->min_version + b % (api->max_version - api->min_version + 1));
}

/* Walk a whole frame held in one buffer: how far it got. */
static km_fw_event walk_flat(const uint8_t *frame, size_t len, int16_t v)
{
	struct evbuffer *in = evbuffer_new();
	km_fetch_walk w;
	km_fw_event ev;
	evbuffer_add(in, frame, len);
	km_fetch_walk_init(&w, v, len);
	while ((ev = km_fetch_walk_next(&w, in, 0)) == KM_FW_PARTITION || ev == KM_FW_BATCH)
		;
	evbuffer_free(in);
	return ev;
}

/*
 * A Fetch response frame through the walk with the offsets hooks, as the session's stream_step
 * runs them: a hook asking for bytes still on their way (KM_STREAM_AGAIN) gets its event again
 * once more have arrived; what the walk has passed goes on. The result keeps the frame's
 * structure: it must walk as far as the frame did.
 */
static void fetch_stream(km_off_req *c, const uint8_t *body, size_t blen, int16_t v, km_fuzz_rng *g)
{
	size_t len = 4 + blen, fed = 0, sent = 0;
	uint8_t *frame = malloc(len), *out = malloc(len);
	struct evbuffer *in = evbuffer_new();
	km_fetch_walk w;
	km_fw_event ev;
	km_stream_ev e = {.w = &w, .in = in, .ctx = c};

	km_put_be32(frame, (uint32_t)blen);
	memcpy(frame + 4, body, blen);
	km_fetch_walk_init(&w, v, len);
	for (;;) {
		km_fetch_walk before = w;
		km_err rc = KM_OK;
		ev = km_fetch_walk_next(&w, in, sent);
		e.first = sent;
		if (ev == KM_FW_ERROR)
			break;
		if (ev == KM_FW_PARTITION)
			rc = km_off_fetch_partition(&e);
		else if (ev == KM_FW_BATCH)
			rc = km_off_fetch_batch(&e);
		if (rc != KM_OK && rc != KM_STREAM_AGAIN)
			break;
		if (rc == KM_STREAM_AGAIN)
			w = before;
		if (ev == KM_FW_END) {
			if (fed < len)
				km_fuzz_add_split(in, g, frame + fed, len - fed);
			fed = len;
			if (evbuffer_get_length(in) != len - sent)
				die("Fetch: bytes lost on the way");
			evbuffer_remove(in, out + sent, len - sent);
			sent = len;
			break;
		}
		if (ev == KM_FW_NEED_MORE || rc == KM_STREAM_AGAIN) {
			size_t have_end = sent + evbuffer_get_length(in), upto = w.pos < have_end ? w.pos : have_end, n;
			if (fed == len)
				die(rc == KM_STREAM_AGAIN ? "Fetch: a hook waits for bytes past the frame"
							  : "Fetch: more bytes asked for after the whole frame");
			if (upto > sent) {
				evbuffer_remove(in, out + sent, upto - sent);
				sent = upto;
			}
			n = km_fuzz_chunk(g, len - fed);
			km_fuzz_add_chain(in, frame + fed, n);
			fed += n;
		}
	}
	if (ev == KM_FW_END && walk_flat(out, len, v) != KM_FW_END)
		die("Fetch: the patched response no longer walks");
	evbuffer_free(in);
	free(frame);
	free(out);
}

/* A request body and the response to it, through the translators. */
static void request_response(int16_t key, int16_t v, const uint8_t *p, size_t n, km_fuzz_rng *g)
{
	km_off_req *c = NULL;
	bool rewrote = false, changed = false;
	size_t rlen;
	km_wr out, resp;

	if (n < 2)
		return;
	rlen = km_be16(p);
	p += 2;
	n -= 2;
	if (rlen > n)
		rlen = n;
	km_wr_init(&out);
	if (km_off_request(key, v, p, rlen, &LK, &c, &rewrote, &out) != KM_OK && (c || rewrote))
		die("a failed request left a context or a rewrite");
	if (rewrote) {
		/* What goes to the broker decodes as the request it replaces. */
		const km_api_info *api = km_api_lookup(key);
		void *m = malloc(api->request.struct_size);
		km_arena a;
		km_rd r;
		km_arena_init(&a, 16 << 20);
		km_rd_init(&r, out.buf, out.len);
		api->request.init(m);
		if (api->request.decode(&r, v, m, &a) != KM_OK || r.pos != r.len)
			die("a rewritten request does not decode");
		km_arena_free(&a);
		free(m);
	}
	km_wr_free(&out);
	/* The response, with the request's context, or one of its own (a map new since the request). */
	if (!c && !(c = km_off_req_new(key, v, &LK)))
		return;
	if (key == KM_API_FETCH) {
		fetch_stream(c, p + rlen, n - rlen, v, g);
	} else {
		km_wr_init(&resp);
		if (km_off_response(c, p + rlen, n - rlen, &changed, &resp) != KM_OK && changed)
			die("a failed response translation says it changed something");
		km_wr_free(&resp);
	}
	km_off_req_free(c);
}

static void share(int16_t key, int16_t v, bool response, const uint8_t *p, size_t n)
{
	bool changed = false;
	km_wr out;
	km_err rc;

	km_wr_init(&out);
	if (response) {
		uint8_t *body = malloc(n ? n : 1);
		memcpy(body, p, n);
		rc = km_share_fetch_response_translate(v, body, n, &LK, &changed, &out);
		free(body);
	} else {
		rc = km_share_request_translate(key, v, p, n, &LK, &changed, &out);
	}
	if (rc != KM_OK && changed)
		die("a failed share translation says it changed something");
	if (changed && out.len == 0)
		die("a changed share message encodes to nothing");
	km_wr_free(&out);
}

static int64_t i64_at(const uint8_t *p, size_t n, size_t i)
{
	return 8 * (i + 1) <= n ? (int64_t)km_be64(p + 8 * i) : 0;
}

/* The map's translations and the share pieces of any offsets: a map byte, then int64s. */
static void map_ops(const uint8_t *p, size_t n)
{
	const km_offmap *m;
	km_share_piece pc[8];
	int64_t l, first, last;
	size_t k;

	if (n < 1)
		return;
	m = &maps[p[0] % NMAPS];
	p++;
	n--;
	for (size_t i = 0; i < n / 8 && i < 8; i++) {
		int64_t x = i64_at(p, n, i);
		(void)km_offmap_to_physical(m, x);
		(void)km_offmap_to_logical(m, x);
		(void)km_offmap_next_to_logical(m, x);
		(void)km_offmap_find_logical(m, x);
		if (km_off_batch_run(m, x, &l) >= 0 && km_offmap_to_physical(m, l) != x)
			die("a visible batch's logical offset does not lead back to it");
	}
	first = i64_at(p, n, 0);
	last = i64_at(p, n, 1);
	for (int side = 0; side < 2; side++) {
		k = side ? km_share_physical_pieces(m, first, last, pc, 8) : km_share_logical_pieces(m, first, last, pc, 8);
		for (size_t i = 0; i < k && i < 8; i++) {
			int64_t lo = side ? pc[i].physical : pc[i].logical, other = side ? pc[i].logical : pc[i].physical;
			if (pc[i].last_delta < 0 || lo < first || lo - first > last - first || pc[i].last_delta > last - lo)
				die("a share piece outside its range");
			if (other < 0 || pc[i].last_delta > INT64_MAX - other)
				die("a share piece whose counterpart passes INT64_MAX");
		}
	}
}

enum { OP_FETCH, OP_LIST_OFFSETS, OP_DELETE_RECORDS, OP_LEADER_EPOCH, OP_PRODUCE, OP_DESCRIBE_PRODUCERS,
       OP_SHARE_FETCH_REQ, OP_SHARE_ACK_REQ, OP_SHARE_FETCH_RESP, OP_MAP, OP_COUNT };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const int16_t keys[OP_COUNT] = {KM_API_FETCH, KM_API_LIST_OFFSETS, KM_API_DELETE_RECORDS,
					       KM_API_OFFSET_FOR_LEADER_EPOCH, KM_API_PRODUCE, KM_API_DESCRIBE_PRODUCERS,
					       KM_API_SHARE_FETCH, KM_API_SHARE_ACKNOWLEDGE, KM_API_SHARE_FETCH, -1};
	km_fuzz_rng g;
	int op;
	int16_t v;

	if (size < 5 || size > (1u << 20))
		return 0;
	op = data[0] % OP_COUNT;
	km_fuzz_rng_init(&g, data + 2);
	v = keys[op] >= 0 ? version_of(keys[op], data[1]) : 0;
	data += 5;
	size -= 5;
	switch (op) {
	case OP_SHARE_FETCH_REQ:
	case OP_SHARE_ACK_REQ:
		share(keys[op], v, false, data, size);
		break;
	case OP_SHARE_FETCH_RESP:
		share(keys[op], v, true, data, size);
		break;
	case OP_MAP:
		map_ops(data, size);
		break;
	default:
		request_response(keys[op], v, data, size, &g);
		break;
	}
	return 0;
}
