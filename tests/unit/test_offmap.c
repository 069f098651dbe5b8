/* The offset map (kmirror/offmap.h): runs, holes, hidden ranges, the tail, and every translation at its boundaries. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/offmap.h"

static void add(km_offmap *m, int64_t l, int64_t p, int64_t prev)
{
	assert_int_equal(km_offmap_add(m, l, p, prev, 0), KM_OK);
}

/* One run for the partition's whole life: the common case. Logical 100.. at physical 0.. */
static void test_one_open_run(void **state)
{
	km_offmap m;
	(void)state;
	km_offmap_init(&m);
	add(&m, 100, 0, -1);
	assert_int_equal(m.n, 1);
	assert_int_equal(km_offmap_run_length(&m, 0), -1);
	assert_int_equal(km_offmap_find_logical(&m, 100), 0);
	assert_int_equal(km_offmap_find_logical(&m, 1000000), 0);
	assert_int_equal(km_offmap_find_logical(&m, 99), -1);
	/* below every run: the first run's start (the source's log start when mirroring began) */
	assert_int_equal(km_offmap_to_physical(&m, 0), 0);
	assert_int_equal(km_offmap_to_physical(&m, 99), 0);
	assert_int_equal(km_offmap_to_physical(&m, 100), 0);
	assert_int_equal(km_offmap_to_physical(&m, 101), 1);
	assert_int_equal(km_offmap_to_physical(&m, INT64_C(1) << 40), (INT64_C(1) << 40) - 100);
	assert_int_equal(km_offmap_to_logical(&m, 0), 100);
	assert_int_equal(km_offmap_to_logical(&m, 1), 101);
	assert_int_equal(km_offmap_to_logical(&m, 5000), 5100);
	/* no tail (no pipeline: a stopped topic): the high watermark goes through the open run */
	assert_int_equal(km_offmap_next_to_logical(&m, 5000), 5100);
	km_offmap_free(&m);
	assert_null(m.runs);
	assert_int_equal(m.n, 0);
	assert_int_equal(m.tail_physical, -1);
}

/*
 * A compacted source: logical 0-4 at physical 0-4, a hole 5-9, logical 10-12 at 5-7, a hole
 * 13-19, then the open run from logical 20 at physical 8.
 */
static void holes_map(km_offmap *m)
{
	km_offmap_init(m);
	add(m, 0, 0, -1);
	add(m, 10, 5, 5);
	add(m, 20, 8, 13);
}

static void test_holes(void **state)
{
	km_offmap m;
	(void)state;
	holes_map(&m);
	assert_int_equal(km_offmap_run_length(&m, 0), 5);
	assert_int_equal(km_offmap_run_length(&m, 1), 3);
	assert_int_equal(km_offmap_run_length(&m, 2), -1);
	assert_int_equal(km_offmap_run_length(&m, 3), -1);
	static const struct { int64_t l; ssize_t run; int64_t p; } lp[] = {
		{0, 0, 0}, {4, 0, 4},                  /* first and last of run 0 */
		{5, -1, 5}, {9, -1, 5},                /* the hole: the next run's start */
		{10, 1, 5}, {11, 1, 6}, {12, 1, 7},    /* run 1 */
		{13, -1, 8}, {19, -1, 8},              /* the second hole */
		{20, 2, 8}, {21, 2, 9}, {1000, 2, 988}, /* the open run */
	};
	for (size_t i = 0; i < sizeof(lp) / sizeof(lp[0]); i++) {
		if (km_offmap_find_logical(&m, lp[i].l) != lp[i].run || km_offmap_to_physical(&m, lp[i].l) != lp[i].p)
			fail_msg("logical %lld: run %zd physical %lld", (long long)lp[i].l,
				 km_offmap_find_logical(&m, lp[i].l), (long long)km_offmap_to_physical(&m, lp[i].l));
	}
	static const int64_t pl[][2] = {{0, 0}, {4, 4}, {5, 10}, {7, 12}, {8, 20}, {9, 21}};
	for (size_t i = 0; i < sizeof(pl) / sizeof(pl[0]); i++) {
		assert_int_equal(km_offmap_to_logical(&m, pl[i][0]), pl[i][1]);
		assert_int_equal(km_offmap_next_to_logical(&m, pl[i][0]), pl[i][1]);
	}
	km_offmap_free(&m);
}

/*
 * Hidden physical ranges: physical 0-9 held before mirroring began (below the first run),
 * logical 0-4 at 10-14, physical 15-19 a batch reconcile found not to belong, logical 5.. at 20.
 * Hidden offsets read as the next run's first logical offset.
 */
static void test_hidden(void **state)
{
	km_offmap m;
	(void)state;
	km_offmap_init(&m);
	add(&m, 5, 20, 5);
	add(&m, 0, 10, -1);
	assert_int_equal(km_offmap_run_length(&m, 0), 5);
	static const int64_t pl[][2] = {{0, 0}, {9, 0}, {10, 0}, {14, 4}, {15, 5}, {19, 5}, {20, 5}, {21, 6}};
	for (size_t i = 0; i < sizeof(pl) / sizeof(pl[0]); i++) {
		if (km_offmap_to_logical(&m, pl[i][0]) != pl[i][1] || km_offmap_next_to_logical(&m, pl[i][0]) != pl[i][1])
			fail_msg("physical %lld: %lld", (long long)pl[i][0], (long long)km_offmap_to_logical(&m, pl[i][0]));
	}
	static const int64_t lp[][2] = {{0, 10}, {4, 14}, {5, 20}, {6, 21}};
	for (size_t i = 0; i < sizeof(lp) / sizeof(lp[0]); i++)
		assert_int_equal(km_offmap_to_physical(&m, lp[i][0]), lp[i][1]);
	/* a hole and a hidden range at once: logical 5-7 gone, physical 15-19 hidden */
	add(&m, 8, 20, 5);
	assert_true(km_offmap_remove(&m, 5));
	assert_int_equal(km_offmap_to_physical(&m, 5), 20);
	assert_int_equal(km_offmap_to_physical(&m, 8), 20);
	assert_int_equal(km_offmap_to_logical(&m, 15), 8);
	assert_int_equal(km_offmap_to_logical(&m, 14), 4);
	assert_int_equal(km_offmap_find_logical(&m, 7), -1);
	km_offmap_free(&m);
}

/*
 * Finding 34's map: seals at physical 1641-1643 were hidden by the run (1641 -> 1644), which a
 * fourth stop's seal run (1641 -> 1645) replaced; the seal never landed and the log ends at 1644.
 * That run alone hides 1641-1643. A plain run that never landed after dense records hides nothing.
 */
static void test_hides_before(void **state)
{
	km_offmap m;
	(void)state;
	km_offmap_init(&m);
	add(&m, 0, 0, -1);
	add(&m, 1641, 1645, 1641);
	assert_true(km_offmap_hides_before(&m, 1, 1644));
	assert_false(km_offmap_hides_before(&m, 1, 1645)); /* it landed: the log ends past it */
	assert_false(km_offmap_hides_before(&m, 0, 1644));
	assert_false(km_offmap_hides_before(&m, 2, 1644));
	assert_false(km_offmap_hides_before(NULL, 1, 1644));
	km_offmap_free(&m);
	km_offmap_init(&m);
	add(&m, 0, 0, -1);
	add(&m, 1641, 1641, 1641); /* the next batch's run, after dense records, never landed */
	assert_false(km_offmap_hides_before(&m, 1, 1641));
	add(&m, 1700, 1705, 1700); /* past a hole: the run before ends at 1700 logically, 1700 physically */
	assert_false(km_offmap_hides_before(&m, 2, 1700));
	assert_true(km_offmap_hides_before(&m, 2, 1703)); /* 1700-1702 were the seal's and others' */
	km_offmap_free(&m);
}

/*
 * A run written over one at the same logical offset keeps where the run before ends (finding 39):
 * logical 0-7650 at physical 0-7650, source offset 7651 a hole (a marker of a transaction with no
 * record on the partition), 7652 on at physical 7665 (the run says the one before ends at 7651).
 * A takeover hides from 7652 and writes its fence run there at the log's end, 7670. With 7652 for
 * the run before's end, that run would take logical 7651 and show the record at physical 7651,
 * one offset early; with the run's own 7651 it stays a hole.
 */
static void test_prev_end_at(void **state)
{
	km_offmap m, w;
	(void)state;
	km_offmap_init(&m);
	add(&m, 0, 0, -1);
	add(&m, 7652, 7665, 7651);
	assert_int_equal(km_offmap_prev_end_at(&m, 7652), 7651);
	assert_int_equal(km_offmap_prev_end_at(&m, 7660), 7660); /* inside a run: it goes on to there */
	assert_int_equal(km_offmap_prev_end_at(&m, 0), 0);       /* the first run: nothing before it */
	assert_int_equal(km_offmap_prev_end_at(NULL, 5), 5);
	km_offmap_init(&w);
	add(&w, 0, 0, -1);
	add(&w, 7652, 7670, km_offmap_prev_end_at(&m, 7652));
	assert_int_equal(km_offmap_to_physical(&w, 7650), 7650);
	assert_int_equal(km_offmap_to_physical(&w, 7652), 7670);
	assert_int_not_equal(km_offmap_to_logical(&w, 7651), 7651);
	km_offmap_free(&w);
	km_offmap_init(&w); /* what was written before: the record at 7651 shown as source offset 7651 */
	add(&w, 0, 0, -1);
	add(&w, 7652, 7670, 7652);
	assert_int_equal(km_offmap_to_logical(&w, 7651), 7651);
	km_offmap_free(&w);
	km_offmap_free(&m);

	/*
	 * Finding 40: one owner wrote a run at 20245 (destination 20284), then found 20245 stood for
	 * no record and wrote one at 20246 at the same destination offset, saying the run at 20245 is
	 * empty. The next owner's fence and resume runs at 20246 keep that word: destination 20284
	 * (a record of the aborted write) is no record; written with the hide point as the run
	 * before's end, it read as source offset 20245, and 20246 was shown twice.
	 */
	km_offmap_init(&m);
	add(&m, 0, 0, -1);
	add(&m, 20245, 20284, 20244);
	add(&m, 20246, 20284, 20245);
	assert_int_equal(km_offmap_prev_end_at(&m, 20246), 20245);
	km_offmap_init(&w);
	add(&w, 0, 0, -1);
	add(&w, 20245, 20284, 20244);
	add(&w, 20246, 20290, km_offmap_prev_end_at(&m, 20246));
	assert_int_equal(km_offmap_to_physical(&w, 20246), 20290);
	assert_int_equal(km_offmap_to_logical(&w, 20290), 20246);
	assert_int_not_equal(km_offmap_to_logical(&w, 20284), 20245);
	km_offmap_free(&w);
	km_offmap_init(&w); /* what the fourteenth run wrote */
	add(&w, 0, 0, -1);
	add(&w, 20245, 20284, 20244);
	add(&w, 20246, 20290, 20246);
	assert_int_equal(km_offmap_to_logical(&w, 20284), 20245);
	km_offmap_free(&w);
	km_offmap_free(&m);
}

/*
 * The tail: logical 0-9 at physical 0-9, then the source ended in a hole (a commit marker):
 * the logical tail 15 runs ahead of the open run's end 10.
 */
static void test_tail(void **state)
{
	km_offmap m;
	(void)state;
	km_offmap_init(&m);
	/* no run and no tail: nothing was mirrored (a stopped topic that never got a record): the offsets are the destination's */
	assert_int_equal(km_offmap_to_physical(&m, 0), 0);
	assert_int_equal(km_offmap_to_physical(&m, 12), 12);
	assert_int_equal(km_offmap_to_logical(&m, 5), 5);
	assert_int_equal(km_offmap_next_to_logical(&m, 9), 9);
	assert_int_equal(km_offmap_find_logical(&m, 0), -1);
	/* no run, tail set (a fresh start before the first batch: records before it are hidden) */
	m.tail_physical = 30;
	m.tail_logical = 7;
	assert_int_equal(km_offmap_to_physical(&m, 0), 30);
	assert_int_equal(km_offmap_to_physical(&m, 7), 30);
	assert_int_equal(km_offmap_to_physical(&m, 99), 30);
	assert_int_equal(km_offmap_to_logical(&m, 30), 7);
	assert_int_equal(km_offmap_to_logical(&m, 29), 7); /* hidden: a reader sees what comes at the tail */
	assert_int_equal(km_offmap_to_logical(&m, 31), -1);
	assert_int_equal(km_offmap_next_to_logical(&m, 30), 7);
	assert_int_equal(km_offmap_next_to_logical(&m, 0), 7); /* the log start of hidden records */

	km_offmap_free(&m);
	add(&m, 0, 0, -1);
	m.tail_physical = 10;
	m.tail_logical = 15;
	assert_int_equal(km_offmap_run_length(&m, 0), -1);
	assert_int_equal(km_offmap_find_logical(&m, 9), 0);
	assert_int_equal(km_offmap_find_logical(&m, 10), -1); /* the trailing hole */
	assert_int_equal(km_offmap_find_logical(&m, 14), -1);
	assert_int_equal(km_offmap_find_logical(&m, 15), -1); /* not mirrored yet */
	assert_int_equal(km_offmap_to_physical(&m, 9), 9);
	assert_int_equal(km_offmap_to_physical(&m, 10), 10);
	assert_int_equal(km_offmap_to_physical(&m, 14), 10);
	assert_int_equal(km_offmap_to_physical(&m, 15), 10); /* at the tail: an empty answer */
	assert_int_equal(km_offmap_to_physical(&m, 1000), 10); /* past it: a consumer ahead waits */
	assert_int_equal(km_offmap_to_logical(&m, 9), 9);
	assert_int_equal(km_offmap_to_logical(&m, 10), 15);
	assert_int_equal(km_offmap_next_to_logical(&m, 10), 15); /* the high watermark */
	assert_int_equal(km_offmap_next_to_logical(&m, 9), 9);
	assert_int_equal(km_offmap_next_to_logical(&m, 0), 0);
	/* a run persisted ahead of its batch (write-ahead): it covers nothing until the tail moves */
	add(&m, 20, 10, 10);
	assert_int_equal(km_offmap_run_length(&m, 0), 10);
	assert_int_equal(km_offmap_find_logical(&m, 20), -1);
	assert_int_equal(km_offmap_to_physical(&m, 20), 10);
	assert_int_equal(km_offmap_to_logical(&m, 10), 15);
	m.tail_physical = 12;
	m.tail_logical = 22;
	assert_int_equal(km_offmap_find_logical(&m, 21), 1);
	assert_int_equal(km_offmap_find_logical(&m, 22), -1);
	assert_int_equal(km_offmap_to_physical(&m, 15), 10); /* the old trailing hole is a hole now */
	assert_int_equal(km_offmap_to_physical(&m, 21), 11);
	assert_int_equal(km_offmap_to_logical(&m, 11), 21);
	assert_int_equal(km_offmap_to_logical(&m, 12), 22);
	assert_int_equal(km_offmap_next_to_logical(&m, 12), 22);
	/* the pipeline gone: the open run is unbounded again */
	m.tail_physical = m.tail_logical = -1;
	assert_int_equal(km_offmap_find_logical(&m, 100), 1);
	assert_int_equal(km_offmap_to_physical(&m, 100), 90);
	km_offmap_free(&m);
}

/*
 * The end of a leader epoch past the tail (a follower's tail is the persisted progress, behind what
 * the kmirrord running the partition served): the records there are translated, never the tail's
 * offset, so that a client that read past the tail elsewhere is not told its log was truncated.
 */
/*
 * A tail the runs put where it is (km_offmap_maps_tail): after the last batch of a run; past holes
 * once their run is in; with a run persisted ahead of its batch at the tail. Past holes whose run
 * is not in: no (the soak's finding 25).
 */
static void test_maps_tail(void **state)
{
	km_offmap m;
	(void)state;
	km_offmap_init(&m);
	assert_true(km_offmap_maps_tail(&m, 0, 0)); /* no run: nothing to say */
	add(&m, 0, 0, -1);
	assert_true(km_offmap_maps_tail(&m, 8, 8));
	assert_false(km_offmap_maps_tail(&m, 8, 9)); /* a hole at source offset 8 passed, its run not in */
	add(&m, 9, 8, 8);
	assert_true(km_offmap_maps_tail(&m, 8, 9));
	assert_true(km_offmap_maps_tail(&m, 8, 8)); /* as for a run persisted ahead of its batch, below */
	assert_true(km_offmap_maps_tail(&m, 12, 13));
	add(&m, 20, 12, 13); /* the next batch's run, persisted before it lands: the tail is still 13 at 12 */
	assert_true(km_offmap_maps_tail(&m, 12, 13));
	assert_true(km_offmap_maps_tail(&m, 12, 20));
	assert_true(km_offmap_maps_tail(&m, 15, 23));
	assert_false(km_offmap_maps_tail(&m, 15, 24));
	add(&m, 21, 12, 20); /* a second hole with no batch between: two runs at one physical offset */
	assert_true(km_offmap_maps_tail(&m, 12, 21));
	km_offmap_free(&m);
}

static void test_epoch_end(void **state)
{
	km_offmap m;
	(void)state;
	km_offmap_init(&m);
	add(&m, 0, 100, -1);
	m.tail_physical = 150;
	m.tail_logical = 50;
	assert_int_equal(km_offmap_end_to_logical(&m, 120), 20); /* before the tail: as next_to_logical */
	assert_int_equal(km_offmap_end_to_logical(&m, 150), 50);
	assert_int_equal(km_offmap_next_to_logical(&m, 180), 50); /* the high watermark stops at the tail */
	assert_int_equal(km_offmap_end_to_logical(&m, 180), 80);  /* the epoch's end does not */
	assert_int_equal(km_offmap_end_to_logical(&m, -1), -1);
	assert_int_equal(km_offmap_end_to_logical(&m, 50), 0); /* before every run: where mirroring began */
	/* The partition ends in a hole (logical [50, 55) a commit marker): the next records from 55 on. */
	m.tail_logical = 55;
	assert_int_equal(km_offmap_end_to_logical(&m, 180), 85);
	/* A run persisted ahead of its batch at the tail (after a hole up to 70): it says where its records are. */
	add(&m, 70, 150, 50);
	assert_int_equal(km_offmap_end_to_logical(&m, 180), 100);
	/* And one past the tail, after hidden records at physical [190, 200). */
	add(&m, 200, 200, 110);
	assert_int_equal(km_offmap_end_to_logical(&m, 195), 200);
	assert_int_equal(km_offmap_end_to_logical(&m, 230), 230);
	/* No tail (the pipeline reconciling, a stopped topic): the runs as always. */
	m.tail_physical = m.tail_logical = -1;
	assert_int_equal(km_offmap_end_to_logical(&m, 230), km_offmap_next_to_logical(&m, 230));
	km_offmap_free(&m);
	/* Nothing mirrored yet, a pipeline at the tail: past it, from the logical tail on. */
	km_offmap_init(&m);
	m.tail_physical = 10;
	m.tail_logical = 40;
	assert_int_equal(km_offmap_end_to_logical(&m, 10), 40);
	assert_int_equal(km_offmap_end_to_logical(&m, 12), 42);
	m.tail_logical = INT64_MAX - 1;
	assert_int_equal(km_offmap_end_to_logical(&m, 20), INT64_MAX);
	km_offmap_free(&m);
}

static void test_replace_remove(void **state)
{
	km_offmap m;
	(void)state;
	holes_map(&m);
	add(&m, 10, 6, 4); /* same logical start: replaced, not added */
	assert_int_equal(m.n, 3);
	assert_int_equal(m.runs[1].physical, 6);
	assert_int_equal(m.runs[1].prev_logical_end, 4);
	assert_int_equal(km_offmap_to_physical(&m, 10), 6);
	assert_int_equal(km_offmap_to_logical(&m, 4), 10); /* run 0 now covers logical 0-3: physical 4 is hidden */
	assert_int_equal(km_offmap_to_logical(&m, 3), 3);
	assert_int_equal(km_offmap_to_logical(&m, 5), 10);
	assert_false(km_offmap_remove(&m, 11));
	assert_true(km_offmap_remove(&m, 10));
	assert_false(km_offmap_remove(&m, 10));
	assert_int_equal(m.n, 2);
	assert_int_equal(km_offmap_find_logical(&m, 10), -1);
	/* run 2's prev_logical_end (13) closes run 0 now, bounded by run 2's physical start: 0-7 */
	assert_int_equal(km_offmap_run_length(&m, 0), 8);
	assert_int_equal(km_offmap_to_physical(&m, 10), 8);
	assert_int_equal(km_offmap_to_physical(&m, 7), 7);
	assert_true(km_offmap_remove(&m, 20));
	assert_true(km_offmap_remove(&m, 0));
	assert_false(km_offmap_remove(&m, 0));
	assert_int_equal(m.n, 0);
	assert_int_equal(km_offmap_to_physical(&m, 3), 3); /* no run left: the destination's own offsets */
	km_offmap_free(&m);
}

static void test_random_order(void **state)
{
	enum { N = 2000 };
	km_offmap a, b;
	size_t order[N];
	int64_t l = 0, p = 0, prev = -1;
	(void)state;
	srand(12345);
	km_offmap_init(&a);
	km_offmap_init(&b);
	for (size_t i = 0; i < N; i++) {
		int64_t len = 1 + rand() % 50;
		add(&a, l, p, prev);
		prev = l + len;
		l = prev + rand() % 4;  /* a hole, or none */
		p += len + rand() % 3;  /* hidden records, or none */
		order[i] = i;
	}
	for (size_t i = N - 1; i > 0; i--) {
		size_t j = (size_t)rand() % (i + 1), t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	for (size_t i = 0; i < N; i++) {
		const km_offrun *r = &a.runs[order[i]];
		add(&b, r->logical, r->physical, r->prev_logical_end);
		if (i % 7 == 0) /* a record read twice (a replay of the same key) changes nothing */
			add(&b, r->logical, r->physical, r->prev_logical_end);
	}
	assert_int_equal(a.n, N);
	assert_int_equal(b.n, N);
	for (size_t i = 0; i < N; i++) { /* field by field: the struct has padding */
		assert_int_equal(a.runs[i].logical, b.runs[i].logical);
		assert_int_equal(a.runs[i].physical, b.runs[i].physical);
		assert_int_equal(a.runs[i].prev_logical_end, b.runs[i].prev_logical_end);
		assert_int_equal(a.runs[i].flags, b.runs[i].flags);
	}
	km_offmap_free(&a);
	km_offmap_free(&b);
}

/*
 * Thousands of runs (a compacted source): run i is logical 10i-10i+4 at physical 7i-7i+4, so a
 * hole of 5 and a hidden range of 2 after each. Every offset of the range against the formula.
 */
static void test_many_runs(void **state)
{
	enum { N = 10000 };
	km_offmap m;
	(void)state;
	km_offmap_init(&m);
	for (int64_t i = 0; i < N; i++)
		add(&m, 10 * i, 7 * i, i ? 10 * (i - 1) + 5 : -1);
	m.tail_physical = 7 * (N - 1) + 5;
	m.tail_logical = 10 * (N - 1) + 5;
	for (int64_t L = 0; L < 10 * N + 10; L++) {
		int64_t i = L / 10, r = L % 10, want;
		ssize_t run = r < 5 && i < N ? (ssize_t)i : -1;
		if (i >= N || (i == N - 1 && r >= 5))
			want = m.tail_physical;
		else
			want = r < 5 ? 7 * i + r : 7 * (i + 1);
		if (km_offmap_to_physical(&m, L) != want || km_offmap_find_logical(&m, L) != run)
			fail_msg("logical %lld: %lld (want %lld)", (long long)L, (long long)km_offmap_to_physical(&m, L),
				 (long long)want);
	}
	for (int64_t P = 0; P < 7 * N + 10; P++) {
		int64_t i = P / 7, r = P % 7, want;
		if (i >= N || (i == N - 1 && r >= 5))
			want = m.tail_logical;
		else
			want = r < 5 ? 10 * i + r : 10 * (i + 1);
		if (km_offmap_to_logical(&m, P) != want)
			fail_msg("physical %lld: %lld (want %lld)", (long long)P, (long long)km_offmap_to_logical(&m, P),
				 (long long)want);
	}
	for (size_t i = 0; i + 1 < N; i++)
		assert_int_equal(km_offmap_run_length(&m, i), 5);
	km_offmap_free(&m);
}

/*
 * A leading hole: mirroring began at the source's log start 0, the first surviving record is 5900
 * (compacted away before). The first run's prev_logical_end says 0: the log start reads 0 through
 * the map, as on the source; records still translate from 5900, and a fetch from 0 starts there.
 * Records the destination held before (physical 0..6) stay hidden either way.
 */
static void test_leading_hole(void **state)
{
	km_offmap m;
	(void)state;
	km_offmap_init(&m);
	add(&m, 5900, 7, 0);
	assert_int_equal(km_offmap_next_to_logical(&m, 0), 0); /* the destination's log start */
	assert_int_equal(km_offmap_next_to_logical(&m, 7), 0);
	assert_int_equal(km_offmap_next_to_logical(&m, 8), 5901);
	assert_int_equal(km_offmap_to_logical(&m, 7), 5900); /* a record offset: the record there */
	assert_int_equal(km_offmap_to_logical(&m, 3), 5900); /* hidden: the next record */
	assert_int_equal(km_offmap_to_physical(&m, 0), 7);
	assert_int_equal(km_offmap_to_physical(&m, 5899), 7);
	assert_int_equal(km_offmap_to_physical(&m, 5901), 8);
	/* without it (-1) the log start is the first record, as before */
	km_offmap_free(&m);
	km_offmap_init(&m);
	add(&m, 5900, 7, -1);
	assert_int_equal(km_offmap_next_to_logical(&m, 0), 5900);
	km_offmap_free(&m);
}

static void test_negative(void **state)
{
	km_offmap m;
	(void)state;
	km_offmap_init(&m);
	assert_int_equal(km_offmap_add(&m, -1, 0, -1, 0), KM_ERR_INVAL);
	assert_int_equal(km_offmap_add(&m, 0, -1, -1, 0), KM_ERR_INVAL);
	assert_int_equal(km_offmap_add(&m, 0, 0, -2, 0), KM_ERR_INVAL);
	assert_int_equal(km_offmap_add(&m, INT64_MIN, INT64_MIN, INT64_MIN, 0), KM_ERR_INVAL);
	assert_int_equal(m.n, 0);
	add(&m, 0, 0, -1);
	assert_int_equal(km_offmap_to_physical(&m, -1), -1);
	assert_int_equal(km_offmap_to_logical(&m, -1), -1);
	assert_int_equal(km_offmap_next_to_logical(&m, -1), -1);
	assert_int_equal(km_offmap_find_logical(&m, -1), -1);
	assert_false(km_offmap_remove(&m, -1));
	assert_int_equal(m.n, 1);
	km_offmap_free(&m);
}

/*
 * An open run without a tail (a stopped topic) stored at other offsets than its logical ones: the
 * offsets near the top of the range whose counterpart would be past INT64_MAX are in no run (the
 * translation overflowed, which UBSan reports), and the rest translate as before.
 */
static void test_top_of_range(void **state)
{
	km_offmap up, down;
	(void)state;
	km_offmap_init(&up);
	add(&up, 10, 200, -1); /* stored above its logical offsets */
	assert_int_equal(km_offmap_to_physical(&up, INT64_MAX - 1000), INT64_MAX - 810);
	assert_int_equal(km_offmap_to_physical(&up, INT64_MAX - 1), -1);
	assert_int_equal(km_offmap_to_physical(&up, INT64_MAX), -1);
	assert_int_equal(km_offmap_find_logical(&up, INT64_MAX - 1), -1);
	assert_int_equal(km_offmap_to_logical(&up, INT64_MAX - 1), INT64_MAX - 191);
	km_offmap_free(&up);

	km_offmap_init(&down);
	add(&down, INT64_MAX - 100, 5, -1); /* stored below */
	assert_int_equal(km_offmap_to_physical(&down, INT64_MAX - 1), 104);
	assert_int_equal(km_offmap_to_logical(&down, 50), INT64_MAX - 55);
	assert_int_equal(km_offmap_to_logical(&down, 1000), -1);
	assert_int_equal(km_offmap_next_to_logical(&down, INT64_MAX), -1);
	km_offmap_free(&down);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_one_open_run), cmocka_unit_test(test_holes),
		cmocka_unit_test(test_hidden), cmocka_unit_test(test_hides_before), cmocka_unit_test(test_prev_end_at),       cmocka_unit_test(test_tail), cmocka_unit_test(test_epoch_end),
		cmocka_unit_test(test_maps_tail),
		cmocka_unit_test(test_replace_remove), cmocka_unit_test(test_random_order),
		cmocka_unit_test(test_many_runs),    cmocka_unit_test(test_negative),
		cmocka_unit_test(test_leading_hole),   cmocka_unit_test(test_top_of_range),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
