/* Unit tests for the API table: Produce acks, and how the features' stages compose into rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/api.h"
#include "kmirror/net.h"
#include "kmirror/wire.h"
#include "proxy/apis.h"

/* A request header as a client writes it (header v2: with one unknown tagged field, which must be skipped). */
static void build_header(km_wr *w, int16_t key, int16_t ver, int32_t corr, const char *client_id, int hv)
{
	km_wr_i16(w, key);
	km_wr_i16(w, ver);
	km_wr_i32(w, corr);
	km_wr_string(w, false, km_str_c(client_id));
	if (hv >= 2) {
		km_wr_uvarint(w, 1);
		km_wr_uvarint(w, 5);
		km_wr_uvarint(w, 2);
		km_wr_u16(w, 0xabcd);
	}
}

static void produce_request(km_wr *w, int16_t ver, const char *txn, int16_t acks)
{
	bool flex = ver >= 9;
	build_header(w, 0, ver, 5, "producer-1", flex ? 2 : 1);
	if (ver >= 3)
		km_wr_string(w, flex, km_str_c(txn));
	km_wr_i16(w, acks);
	km_wr_i32(w, 30000);
}

static void test_produce_acks(void **state)
{
	static const struct {
		int16_t ver;
		const char *txn;
		int16_t acks;
	} cases[] = {{2, NULL, 0}, {3, NULL, 0}, {3, "txn-a", 1}, {7, "t", -1}, {8, NULL, 0},
		     {9, NULL, 0}, {9, "transactional-id-x", 1}, {11, NULL, -1}, {11, "x", 0}};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		km_wr w;
		int16_t acks = 99;
		km_wr_init(&w);
		produce_request(&w, cases[i].ver, cases[i].txn, cases[i].acks);
		assert_int_equal(km_proxy_produce_acks(w.buf, w.len, cases[i].ver, &acks), KM_OK);
		assert_int_equal(acks, cases[i].acks);
		/* Cut before acks: must fail, not guess. */
		assert_int_not_equal(km_proxy_produce_acks(w.buf, w.len - 5, cases[i].ver, &acks), KM_OK);
		km_wr_free(&w);
	}
}

/* ---- composition: stages that log their calls ---- */

#define TEST_KEY 32100 /* not in the codec: a row of the test's own */

static char calls[64];

static void called(const char *what)
{
	strncat(calls, what, sizeof(calls) - strlen(calls) - 1);
}

static km_err a_classify(km_req *rq) { (void)rq; called("a"); return KM_OK; }
static km_err b_classify(km_req *rq) { (void)rq; called("b"); return KM_OK; }
static km_err c_classify(km_req *rq) { (void)rq; called("c"); return KM_OK; }
static km_err a_request(km_req *rq) { (void)rq; called("A"); return KM_OK; }
static km_err c_request(km_req *rq) { (void)rq; called("C"); return KM_OK; }

/* B answers (the way read-only answers a Produce whose partitions are all refused). */
static km_err b_answers(km_req *rq)
{
	called("B");
	rq->answer = evbuffer_new();
	return rq->answer ? KM_OK : KM_ERR_NOMEM;
}

/* B leaves the request pending (the way a mirror RPC waits for the store). */
static km_err b_pends(km_req *rq)
{
	called("B");
	rq->pending = true;
	return KM_OK;
}

/* B rewrites: later stages still run, on the new frame. */
static km_err b_rewrites(km_req *rq)
{
	called("B");
	rq->rewritten = evbuffer_new();
	return rq->rewritten ? KM_OK : KM_ERR_NOMEM;
}

/* B asks for more of the frame: classification starts again from the first stage later. */
static km_err b_needs_more(km_req *rq)
{
	called("b");
	rq->need = rq->body_len + 10;
	return KM_OK;
}

static km_err b_fails(km_req *rq)
{
	called("B");
	rq->close_reason = "refused";
	return KM_ERR_DECODE;
}

static km_err whole_hook(km_resp *rs) { (void)rs; return KM_OK; }

static const km_proxy_stage a_stages[] = {
	{.key = TEST_KEY, .versions = true, .min_version = 0, .max_version = 5, .classify = a_classify,
	 .on_request = a_request, .resp = KM_RESP_WHOLE, .on_response = whole_hook, .note = "a"},
};
static const km_proxy_stage b_stages[] = {
	{.key = TEST_KEY, .versions = true, .min_version = 1, .max_version = 3, .req = KM_REQ_HOLD,
	 .classify = b_classify, .on_request = b_answers, .note = "b"},
};
static const km_proxy_stage c_stages[] = {
	{.key = TEST_KEY, .in_place = true, .classify = c_classify, .on_request = c_request, .note = "c"},
};
static const km_proxy_feature fa = {"fa", a_stages, 1}, fb = {"fb", b_stages, 1}, fc = {"fc", c_stages, 1};

/* One request of the test row as the session hands it to the row's hooks. */
static void run_row(const km_proxy_api *row, bool request, km_req *rq)
{
	static const km_req_header h = {.api_key = TEST_KEY, .api_version = 2};
	static const uint8_t body[16];
	memset(rq, 0, sizeof(*rq));
	rq->api = row;
	rq->h = &h;
	rq->body = body;
	rq->body_len = rq->frame_len = sizeof(body);
	rq->expect_response = true;
	calls[0] = '\0';
	if (row->classify)
		(void)row->classify(rq);
	if (request && row->on_request)
		(void)row->on_request(rq);
	if (rq->answer)
		evbuffer_free(rq->answer);
	if (rq->rewritten)
		evbuffer_free(rq->rewritten);
}

/* Stages run in the order of the features, whatever the order of their hooks' kinds. */
static void test_stages_run_in_feature_order(void **state)
{
	const km_proxy_feature *order1[] = {&fa, &fc}, *order2[] = {&fc, &fa};
	km_proxy_apis *t1 = km_proxy_apis_compose(order1, 2), *t2 = km_proxy_apis_compose(order2, 2);
	km_req rq;

	(void)state;
	assert_non_null(t1);
	assert_non_null(t2);
	run_row(km_proxy_apis_find(t1, TEST_KEY), true, &rq);
	assert_string_equal(calls, "acAC");
	run_row(km_proxy_apis_find(t2, TEST_KEY), true, &rq);
	assert_string_equal(calls, "caCA");
	assert_string_equal(km_proxy_apis_find(t1, TEST_KEY)->note, "a; c");
	assert_string_equal(km_proxy_apis_find(t2, TEST_KEY)->note, "c; a");
	km_proxy_apis_free(t1);
	km_proxy_apis_free(t2);
}

/* A stage that answers, leaves pending or fails stops the stages after it; a rewrite does not. */
static void test_answer_stops_later_stages(void **state)
{
	static const struct {
		km_req_hook b_request;
		const char *want;
	} cases[] = {
		{b_answers, "abcAB"}, {b_pends, "abcAB"}, {b_fails, "abcAB"}, {b_rewrites, "abcABC"},
	};
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		km_proxy_stage b = b_stages[0];
		km_proxy_feature fb_i = {"fb", &b, 1};
		const km_proxy_feature *order[] = {&fa, &fb_i, &fc};
		km_proxy_apis *t;
		km_req rq;

		b.on_request = cases[i].b_request;
		t = km_proxy_apis_compose(order, 3);
		assert_non_null(t);
		run_row(km_proxy_apis_find(t, TEST_KEY), true, &rq);
		assert_string_equal(calls, cases[i].want);
		km_proxy_apis_free(t);
	}
}

/* A stage that asks for more bytes stops classify: the later stages see the request once they are here. */
static void test_need_more_stops_classify(void **state)
{
	km_proxy_stage b = b_stages[0];
	km_proxy_feature fb_more = {"fb", &b, 1};
	const km_proxy_feature *order[] = {&fa, &fb_more, &fc};
	km_proxy_apis *t;
	km_req rq;

	(void)state;
	b.classify = b_needs_more;
	assert_non_null(t = km_proxy_apis_compose(order, 3));
	run_row(km_proxy_apis_find(t, TEST_KEY), false, &rq);
	assert_string_equal(calls, "ab");
	assert_true(rq.need > rq.body_len);
	km_proxy_apis_free(t);
}

/* The row takes the narrowest versions, the strongest action, in place from any stage, the one response. */
static void test_row_fields_from_stages(void **state)
{
	const km_proxy_feature *order[] = {&fa, &fb, &fc}, *twice[] = {&fa, &fa};
	km_proxy_apis *t = km_proxy_apis_compose(order, 3);
	const km_proxy_api *row;
	struct evbuffer *doc = evbuffer_new();
	char *line;

	(void)state;
	assert_non_null(t);
	row = km_proxy_apis_find(t, TEST_KEY);
	assert_int_equal(km_proxy_api_min(row), 1);
	assert_int_equal(km_proxy_api_max(row), 3);
	assert_int_equal(row->req, KM_REQ_HOLD);
	assert_true(row->in_place);
	assert_int_equal(row->resp, KM_RESP_WHOLE);
	assert_true(row->on_response == whole_hook);
	assert_int_equal(row->nstages, 3);
	/* The doc table names the stages in order. */
	km_proxy_apis_write_doc(t, doc);
	evbuffer_add(doc, "", 1);
	line = strstr((char *)evbuffer_pullup(doc, -1), "| 32100 |");
	assert_non_null(line);
	assert_non_null(strstr(line, "| 1-3 | fa, fb, fc | hold + classify | whole | a; b; c |"));
	evbuffer_free(doc);
	km_proxy_apis_free(t);
	/* Two stages answering the response of one row do not compose. */
	assert_null(km_proxy_apis_compose(twice, 2));
}

/* The proxy's own table: each row's stages in the documented order. */
static void test_table_order(void **state)
{
	static const struct {
		int16_t key;
		const char *features[3];
	} rows[] = {
		{KM_API_PRODUCE, {"endpoints", "read-only", "offsets"}},
		{KM_API_FETCH, {"endpoints", "swap-hold", "offsets"}},
		{KM_API_DELETE_RECORDS, {"read-only", "offsets"}},
		{KM_API_DESCRIBE_CONFIGS, {"endpoints", "mirror-name"}},
		{KM_API_SHARE_FETCH, {"endpoints", "share-offsets"}},
		{KM_API_LIST_OFFSETS, {"offsets"}},
	};
	km_proxy_apis *t = km_proxy_apis_new();

	(void)state;
	assert_non_null(t);
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const km_proxy_api *row = km_proxy_apis_find(t, rows[i].key);
		size_t n = 0;
		while (n < 3 && rows[i].features[n])
			n++;
		assert_non_null(row);
		assert_int_equal(row->nstages, n);
		for (size_t j = 0; j < n; j++)
			assert_string_equal(row->features[j], rows[i].features[j]);
	}
	km_proxy_apis_free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_produce_acks),
		cmocka_unit_test(test_stages_run_in_feature_order),
		cmocka_unit_test(test_answer_stops_later_stages),
		cmocka_unit_test(test_need_more_stops_classify),
		cmocka_unit_test(test_row_fields_from_stages),
		cmocka_unit_test(test_table_order),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
