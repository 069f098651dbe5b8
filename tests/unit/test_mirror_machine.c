/*
 * Unit tests for the partition machine (src/mirror/pipeline/machine.c): its edges, the one writer
 * of the phase, and the tick's decision for a partition (km_pl_step), on partitions built here;
 * no broker involved.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mirror/pipeline/pipeline.h"

typedef struct fixture {
	km_pipeline pl;
	mtopic t;
	mpart p;
} fixture;

static void fixture_init(fixture *f, km_mp_state state, mphase phase)
{
	memset(f, 0, sizeof(*f));
	f->pl.name = "east";
	f->t.pl = &f->pl;
	f->t.name = "orders";
	f->p.t = &f->t;
	f->p.id = 0;
	f->p.state = state;
	f->p.phase = phase;
	f->p.lead.src = 1;
	f->p.lead.dst = 2;
	f->p.plan.pid = 1000;
}

/* The paths the pipeline takes are edges of the machine. */
static void test_paths_are_edges(void **state)
{
	static const mphase paths[][12] = {
		/* a start: reconcile, then the source's start position, then fetch and write */
		{PH_IDLE, PH_RECONCILE, PH_RECON_WAIT, PH_RECON_LSO, PH_START, PH_START_WAIT, PH_READY, PH_FETCHING,
		 PH_RUNS, PH_WRITING, PH_READY, PH_IDLE},
		/* reconcile with transactions left open: the hidden range settled, fenced, a second pass */
		{PH_RECONCILE, PH_RECON_WAIT, PH_RECON_LSO, PH_RECON_ABORTED, PH_RUNS, PH_FENCE, PH_RECONCILE,
		 PH_RECON_WAIT, PH_RECON_LSO, PH_READY, PH_FETCHING, PH_WRITING},
		/*
		 * a COMMIT marker at the hide point, then at the tail: the source asked what its offset
		 * holds, the hidden range settled again earlier, fenced; a later reconcile's tail
		 */
		{PH_RECON_LSO, PH_RECON_ABORTED, PH_RECON_MARKER, PH_RECON_ABORTED, PH_RECON_MARKER, PH_RUNS, PH_FENCE,
		 PH_RECONCILE, PH_RECON_WAIT, PH_RECON_LSO, PH_RECON_TAIL, PH_RECON_MARKER},
		/* failback: probes out and in, the divergent tail hidden by a run */
		{PH_START, PH_START_WAIT, PH_START, PH_RUNS, PH_READY, PH_FETCHING, PH_READY, PH_FETCHING, PH_START,
		 PH_START_WAIT, PH_READY, PH_RUNS},
		/* fetched ahead: its writes end while the Fetch is out; then its answer starts a run */
		{PH_READY, PH_FETCHING, PH_WRITING, PH_FETCHING, PH_WRITING, PH_RUNS, PH_WRITING, PH_READY, PH_FETCHING,
		 PH_RUNS, PH_READY, PH_FETCHING},
	};
	(void)state;
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
		for (size_t k = 1; k < 12; k++)
			assert_true(km_pl_phase_edge(paths[i][k - 1], paths[i][k]));
	/* IDLE and RECONCILE are reachable from every phase. */
	for (int ph = PH_IDLE; ph <= PH_WRITING; ph++) {
		assert_true(km_pl_phase_edge((mphase)ph, PH_IDLE));
		assert_true(km_pl_phase_edge((mphase)ph, PH_RECONCILE));
		assert_non_null(km_pl_phase_names[ph]);
	}
}

/* What the machine never does: fetch before it is positioned, write before a fetch, skip reconcile's steps. */
static void test_non_edges(void **state)
{
	static const mphase bad[][2] = {
		{PH_IDLE, PH_FETCHING},  {PH_IDLE, PH_READY},        {PH_READY, PH_WRITING},
		{PH_WRITING, PH_START},  {PH_FETCHING, PH_RECON_LSO}, {PH_RECON_WAIT, PH_READY},
		{PH_START, PH_FETCHING}, {PH_FENCE, PH_READY},       {PH_RECONCILE, PH_READY},
		{PH_RECON_MARKER, PH_FETCHING}, {PH_RECON_MARKER, PH_RECON_TAIL},
	};
	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_false(km_pl_phase_edge(bad[i][0], bad[i][1]));
}

/*
 * Fetching ahead: a partition writing its last batches, all sent, may be fetched (its phase stays
 * WRITING); one with a batch unsent, a probe out or already in a Fetch may not; while its part of
 * that answer is taken nothing it plans is sent; leaving WRITING drops the Fetch sent ahead.
 */
static void test_fetch_ahead(void **state)
{
	fixture f;
	mbatch a = {.sent = true, .kind = BK_DATA}, b = {.kind = BK_DATA};
	(void)state;
	fixture_init(&f, KM_MP_MIRRORING, PH_WRITING);
	f.p.plan.head = f.p.plan.tail = &a;
	f.p.out.inflight = 1;
	assert_true(km_pl_fetchable(&f.p, 0));
	f.p.out.probe = true;
	assert_false(km_pl_fetchable(&f.p, 0));
	f.p.out.probe = false;
	a.next = &b;
	f.p.plan.tail = &b;
	assert_false(km_pl_fetchable(&f.p, 0)); /* b is not sent */
	assert_ptr_equal(km_pl_next_unsent(&f.p), &b);
	f.p.fetch.ahead = true; /* in a Fetch sent ahead, its part being taken: b waits */
	f.p.fetch.taken = true;
	assert_null(km_pl_next_unsent(&f.p));
	f.p.fetch.taken = false;
	assert_ptr_equal(km_pl_next_unsent(&f.p), &b);
	b.sent = true;
	assert_false(km_pl_fetchable(&f.p, 0)); /* already in a Fetch */
	km_pl_set_phase(&f.p, PH_RUNS, "its batches start runs");
	assert_false(f.p.fetch.ahead);
	f.p.settling = true;
	km_pl_set_phase(&f.p, PH_WRITING, "its runs are persisted");
	assert_false(km_pl_fetchable(&f.p, 0)); /* settling */
}

static void test_set_phase_writes(void **state)
{
	fixture f;
	(void)state;
	fixture_init(&f, KM_MP_MIRRORING, PH_READY);
	km_pl_set_phase(&f.p, PH_FETCHING, "test");
	assert_int_equal(f.p.phase, PH_FETCHING);
	km_pl_set_phase(&f.p, PH_FETCHING, "test");
	assert_int_equal(f.p.phase, PH_FETCHING);
	/* Off the edges it is said (a warning) and still done: the machine never stays stuck. */
	km_pl_set_phase(&f.p, PH_RECON_LSO, "test");
	assert_int_equal(f.p.phase, PH_RECON_LSO);
	assert_true(km_pl_reconciling(&f.p));
	km_pl_set_phase(&f.p, PH_START, "test");
	assert_false(km_pl_reconciling(&f.p));
}

static void test_step_running(void **state)
{
	mstep_view v = {.txl_known = true};
	fixture f;
	(void)state;
	fixture_init(&f, KM_MP_MIRRORING, PH_READY);
	assert_int_equal(km_pl_step(&f.p, &v, 1000), STEP_NONE);
	f.p.retry.at = 2000;
	assert_int_equal(km_pl_step(&f.p, &v, 1000), STEP_WAIT);
	assert_int_equal(km_pl_step(&f.p, &v, 2000), STEP_NONE);

	fixture_init(&f, KM_MP_MIRRORING, PH_RECONCILE);
	assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_RECONCILE);
	f.p.out.inflight = 1; /* what is in flight is answered first: the log then says what landed */
	assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_NONE);
	f.p.out.inflight = 0;
	f.p.recon.need_pid = true;
	assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_NONE);
	f.p.recon.need_pid = false;
	f.p.lead.dst = -1;
	assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_NONE);
	f.p.lead.dst = 2;
	v.txl_known = false; /* the transactional ids an earlier life left are listed first */
	assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_NONE);
	v.txl_known = true;

	fixture_init(&f, KM_MP_PREPARING, PH_START);
	assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_START);
	f.p.lead.src = -1;
	assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_NONE);

	fixture_init(&f, KM_MP_MIRRORING, PH_FENCE);
	assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_FENCE);

	fixture_init(&f, KM_MP_PAUSED, PH_IDLE);
	assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_IDLE);
}

/* Pausing and stopping: settled once out of reconcile, or in its first step when nothing can be left open. */
static void test_step_draining(void **state)
{
	mstep_view v = {.txl_known = true};
	fixture f;
	(void)state;
	for (int s = 0; s < 2; s++) {
		km_mp_state st = s ? KM_MP_STOPPING : KM_MP_PAUSING;
		fixture_init(&f, st, PH_WRITING);
		assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_SETTLE);
		fixture_init(&f, st, PH_IDLE);
		assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_SETTLE);
		fixture_init(&f, st, PH_RECON_WAIT); /* reconcile under way: finished first */
		assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_NONE);
		fixture_init(&f, st, PH_FENCE);
		assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_FENCE);
		fixture_init(&f, st, PH_RECONCILE);
		v.settle_needs_reconcile = false;
		assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_SETTLE);
		v.settle_needs_reconcile = true; /* transactions may be open: reconcile aborts them first */
		assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_RECONCILE);
		v.settle_needs_reconcile = false;
		f.p.out.inflight = 2;
		assert_int_equal(km_pl_step(&f.p, &v, 0), STEP_NONE);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_paths_are_edges),
		cmocka_unit_test(test_non_edges),
		cmocka_unit_test(test_fetch_ahead),
		cmocka_unit_test(test_set_phase_writes),
		cmocka_unit_test(test_step_running),
		cmocka_unit_test(test_step_draining),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
