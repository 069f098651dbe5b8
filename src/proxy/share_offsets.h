/* Proxy-internal: offset translation of share groups (KIP-932: ShareFetch, ShareAcknowledge) on mirror topics. */
#ifndef KMIRROR_PROXY_SHARE_OFFSETS_H
#define KMIRROR_PROXY_SHARE_OFFSETS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmirror/arena.h"
#include "kmirror/error.h"
#include "kmirror/offmap.h"
#include "kmirror/wire.h"
#include "proxy/apis.h"
#include "proxy/offsets.h"

/*
 * A contiguous piece of a range that lies in one run: logical [logical, logical + last_delta] is
 * stored at physical [physical, physical + last_delta]. last_delta is the length - 1, so that
 * every piece has a value: one may end at INT64_MAX, and [0, INT64_MAX] is one offset longer than
 * INT64_MAX.
 */
typedef struct km_share_piece {
	int64_t logical, physical, last_delta;
} km_share_piece;

/*
 * The pieces of logical [first, last] (inclusive) that are in runs, in order, into out (up to cap;
 * the count is returned whatever cap is, so a first call with cap 0 sizes the array). Offsets in
 * holes have no piece. A map with no run: the offsets themselves when no pipeline runs the
 * partition (nothing was mirrored), else none (nothing is there yet).
 */
size_t km_share_logical_pieces(const km_offmap *m, int64_t first, int64_t last, km_share_piece *out, size_t cap);
/* The same from the physical side: physical [first, last]; hidden offsets have no piece. */
size_t km_share_physical_pieces(const km_offmap *m, int64_t first, int64_t last, km_share_piece *out, size_t cap);

/*
 * A ShareFetch or ShareAcknowledge request body (after its header): the AcknowledgementBatches
 * of mapped partitions logical -> physical into out (*changed true), else out stays empty.
 */
km_err km_share_request_translate(int16_t key, int16_t version, const uint8_t *body, size_t len,
				  const km_off_lookup *lk, bool *changed, km_wr *out) __attribute__((warn_unused_result));

/*
 * A ShareFetch response body: record batches of mapped partitions are patched in body itself (the
 * Records bytes are rewritten where they are), AcquiredRecords physical -> logical; the translated
 * body into out (*changed true), else out stays empty and body is unchanged.
 */
km_err km_share_fetch_response_translate(int16_t version, uint8_t *body, size_t len, const km_off_lookup *lk,
					 bool *changed, km_wr *out) __attribute__((warn_unused_result));

/* The stages (km_share_off_feature, apis.h): ShareFetch and ShareAcknowledge. */

#endif
