/* The offset map of a mirrored partition: runs of logical offsets at physical offsets, and their translations (docs/mirror.md). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/offmap.h"

void km_offmap_init(km_offmap *m)
{
	memset(m, 0, sizeof(*m));
	m->tail_physical = -1;
	m->tail_logical = -1;
	m->tail_epoch = -1;
	m->open_txn_logical = -1;
}

void km_offmap_free(km_offmap *m)
{
	free(m->runs);
	km_offmap_init(m);
}

static bool tail_set(const km_offmap *m)
{
	return m->tail_physical >= 0 && m->tail_logical >= 0;
}

/* The first run index whose logical start is > L (n when none): binary search. */
static size_t upper_logical(const km_offmap *m, int64_t logical)
{
	size_t lo = 0, hi = m->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (m->runs[mid].logical <= logical)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The first run index whose physical start is > P (n when none). */
static size_t upper_physical(const km_offmap *m, int64_t physical)
{
	size_t lo = 0, hi = m->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (m->runs[mid].physical <= physical)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

/*
 * How many offsets run i covers, the same on both sides. A closed run ends where the next one's
 * prev_logical_end says; the open run at the tail when one is set, else at the top of the offset
 * range. Bounded by the next run's starts on both sides so that records loaded from a damaged or
 * half-rewritten map never translate into another run's range, and by INT64_MAX on both sides so
 * that start + distance never overflows (an open run stored above its logical offsets would reach
 * past it).
 */
static int64_t covered(const km_offmap *m, size_t i)
{
	const km_offrun *r = &m->runs[i];
	int64_t len = min64(INT64_MAX - r->logical, INT64_MAX - r->physical);

	if (i + 1 < m->n) {
		const km_offrun *nx = &m->runs[i + 1];
		len = min64(len, min64(nx->prev_logical_end - r->logical,
				       min64(nx->logical - r->logical, nx->physical - r->physical)));
	} else if (tail_set(m)) {
		len = min64(len, min64(m->tail_physical - r->physical, m->tail_logical - r->logical));
	}
	return len > 0 ? len : 0;
}

km_err km_offmap_add(km_offmap *m, int64_t logical, int64_t physical, int64_t prev_logical_end, uint8_t flags)
{
	size_t at;

	if (logical < 0 || physical < 0 || prev_logical_end < -1)
		return KM_ERR_INVAL;
	at = upper_logical(m, logical);
	if (at > 0 && m->runs[at - 1].logical == logical) {
		m->runs[at - 1].physical = physical;
		m->runs[at - 1].prev_logical_end = prev_logical_end;
		m->runs[at - 1].flags = flags;
		return KM_OK;
	}
	if (m->n == m->cap) {
		size_t nc = m->cap ? m->cap * 2 : 4;
		km_offrun *nr;
		if (nc < m->cap || nc > SIZE_MAX / sizeof(*nr))
			return KM_ERR_NOMEM;
		if (!(nr = realloc(m->runs, nc * sizeof(*nr))))
			return KM_ERR_NOMEM;
		m->runs = nr;
		m->cap = nc;
	}
	/* Appending is the common case (loading in log order, the pipeline's new runs): no move then. */
	memmove(m->runs + at + 1, m->runs + at, (m->n - at) * sizeof(*m->runs));
	m->runs[at] = (km_offrun){.logical = logical, .physical = physical, .prev_logical_end = prev_logical_end,
				  .flags = flags};
	m->n++;
	return KM_OK;
}

bool km_offmap_remove(km_offmap *m, int64_t logical)
{
	size_t at = upper_logical(m, logical);

	if (at == 0 || m->runs[at - 1].logical != logical)
		return false;
	at--;
	memmove(m->runs + at, m->runs + at + 1, (m->n - at - 1) * sizeof(*m->runs));
	m->n--;
	return true;
}

ssize_t km_offmap_find_logical(const km_offmap *m, int64_t logical)
{
	size_t at;

	if (logical < 0 || m->n == 0)
		return -1;
	at = upper_logical(m, logical);
	if (at == 0)
		return -1;
	at--;
	return logical - m->runs[at].logical < covered(m, at) ? (ssize_t)at : -1;
}

int64_t km_offmap_run_length(const km_offmap *m, size_t i)
{
	if (i + 1 >= m->n)
		return -1;
	return covered(m, i);
}

int64_t km_offmap_hidden(const km_offmap *m)
{
	int64_t n = 0;
	for (size_t i = 1; m && i < m->n; i++) {
		int64_t gap = m->runs[i].physical - (m->runs[i - 1].physical + covered(m, i - 1));
		if (gap > 0)
			n += gap;
	}
	return n;
}

int64_t km_offmap_prev_end_at(const km_offmap *m, int64_t at)
{
	for (size_t i = 0; m && i < m->n; i++)
		if (m->runs[i].logical == at)
			return m->runs[i].prev_logical_end >= 0 && m->runs[i].prev_logical_end < at ? m->runs[i].prev_logical_end
												       : at;
	return at;
}

bool km_offmap_hides_before(const km_offmap *m, size_t i, int64_t end)
{
	const km_offrun *r, *prev;

	if (!m || i == 0 || i >= m->n)
		return false;
	r = &m->runs[i];
	prev = &m->runs[i - 1];
	return r->physical > end && r->prev_logical_end >= prev->logical &&
	       prev->physical + (r->prev_logical_end - prev->logical) < end;
}

int64_t km_offmap_to_physical(const km_offmap *m, int64_t logical)
{
	size_t at;

	if (logical < 0)
		return -1;
	/* No run: nothing mirrored. A pipeline waits at its tail; without one the offsets are the destination's own. */
	if (m->n == 0)
		return tail_set(m) ? m->tail_physical : logical;
	if (tail_set(m) && logical >= m->tail_logical)
		return m->tail_physical;
	at = upper_logical(m, logical);
	if (at == 0)
		return m->runs[0].physical;
	at--;
	if (logical - m->runs[at].logical < covered(m, at))
		return m->runs[at].physical + (logical - m->runs[at].logical);
	/* A hole: the next record is the next run's first, or (a trailing hole) the next one to land at the tail. */
	return at + 1 < m->n ? m->runs[at + 1].physical : m->tail_physical;
}

int64_t km_offmap_to_logical(const km_offmap *m, int64_t physical)
{
	size_t at;

	if (physical < 0)
		return -1;
	if (m->n == 0)
		return !tail_set(m) ? physical : physical <= m->tail_physical ? m->tail_logical : -1;
	at = upper_physical(m, physical);
	if (at == 0)
		return m->runs[0].logical;
	at--;
	if (physical - m->runs[at].physical < covered(m, at))
		return m->runs[at].logical + (physical - m->runs[at].physical);
	/* Hidden: what a reader sees next is the next run's first record, or past the open run's end the logical tail. */
	return at + 1 < m->n ? m->runs[at + 1].logical : m->tail_logical;
}

bool km_offmap_maps_tail(const km_offmap *m, int64_t physical, int64_t logical)
{
	size_t at = upper_physical(m, physical);

	if (at > 0 && m->runs[at - 1].physical == physical && m->runs[at - 1].logical == logical)
		return true;
	while (at > 0 && m->runs[at - 1].physical >= physical)
		at--;
	return at == 0 || m->runs[at - 1].logical + (physical - m->runs[at - 1].physical) == logical;
}

int64_t km_offmap_next_to_logical(const km_offmap *m, int64_t physical)
{
	if (tail_set(m) && physical == m->tail_physical)
		return m->tail_logical;
	/* At or before the first run: where mirroring began, which a hole may separate from the first record. */
	if (m->n && physical >= 0 && physical <= m->runs[0].physical && m->runs[0].prev_logical_end >= 0)
		return m->runs[0].prev_logical_end;
	return km_offmap_to_logical(m, physical);
}

int64_t km_offmap_end_to_logical(const km_offmap *m, int64_t physical)
{
	km_offmap open;
	size_t at;
	int64_t l;

	if (physical < 0)
		return -1;
	if (!tail_set(m) || physical <= m->tail_physical)
		return km_offmap_next_to_logical(m, physical);
	at = upper_physical(m, physical);
	if (at > 0 && m->runs[at - 1].physical >= m->tail_physical) {
		/* A run persisted ahead of its batch says where its records are: the runs, not ended at the tail. */
		open = *m;
		open.tail_physical = open.tail_logical = -1;
		l = km_offmap_to_logical(&open, physical);
	} else {
		/* The next records land at the physical tail with the logical tail's offset, and on from there. */
		l = physical - m->tail_physical > INT64_MAX - m->tail_logical
			    ? INT64_MAX
			    : m->tail_logical + (physical - m->tail_physical);
	}
	return l > m->tail_logical ? l : m->tail_logical;
}
