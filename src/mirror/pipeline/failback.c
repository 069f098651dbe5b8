/* Failback: the source is a kmirrord that mirrored these topics from here; only the delta crosses. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/hash.h"
#include "kmirror/log.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/last_mirrored_offsets_request.h"
#include "kmirror/msg/last_mirrored_offsets_response.h"
#include "kmirror/rpc.h"
#include "mirror/pipeline/pipeline.h"

static void on_peer(km_net_client *c, const km_rpc_response *res, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	mtopic *t = x->extra;
	const km_last_mirrored_offsets_response *r = res->msg;
	km_err err = km_rpc_transport_err(res);

	free(x);
	if (pl->closing || t->peer != PEER_ASKED)
		return;
	if (err != KM_OK) {
		km_cluster_drop(pl->src, c);
		t->peer = PEER_UNKNOWN; /* asked again */
		km_pl_tick_soon(pl);
		return;
	}
	t->peer = PEER_NONE;
	if (r && !r->error_code && r->topics.count == 1 && !r->topics.items[0].error_code) {
		t->peer = PEER_KNOWN;
		t->peer_source_id = r->topics.items[0].source_topic_id;
		for (int32_t i = 0; i < r->topics.items[0].partitions.count; i++) {
			const km_last_mirrored_offsets_response_partition_result *pr = &r->topics.items[0].partitions.items[i];
			mpart *p = km_pl_part_get(pl, t, pr->partition_index, false);
			if (!p)
				continue;
			p->fb.peer_offset = pr->last_mirrored_offset;
			p->fb.peer_epoch = pr->last_mirrored_epoch;
			snprintf(p->fb.peer_state, sizeof(p->fb.peer_state), "%.*s", pr->state.len > 0 ? (int)pr->state.len : 0,
				 pr->state.p);
		}
		KM_INFO(COMP, 0, "%s/%s: the source's kmirrord holds this topic in a mirror of its own: a failback when it "
			"was mirrored from here", pl->name, t->name);
	}
	km_pl_tick_soon(pl);
}

/* The hash of a record's key, value, headers and timestamp; 0 when offset is in none of the batches. */
static uint64_t record_hash(const km_bytes *records, int64_t offset)
{
	km_batch_iter it;
	km_batch b;
	uint64_t h = 0;

	km_batch_iter_init(&it, records->p, records->len > 0 ? (size_t)records->len : 0);
	while (!h && km_batch_next(&it, &b)) {
		km_record_iter ri;
		km_record rec;
		uint8_t *scratch = NULL;
		if (b.control || offset < b.base_offset || offset > b.base_offset + b.last_offset_delta)
			continue;
		if (b.codec != KM_CODEC_NONE && !(scratch = malloc(MAX_BATCH_BYTES)))
			return 0;
		if (km_batch_records(&b, scratch, scratch ? MAX_BATCH_BYTES : 0, &ri) == KM_OK)
			while (km_record_next(&ri, &rec))
				if (rec.offset == offset) {
					h = 1469598103934665603ULL;
					h = km_fnv1a(h, &rec.key.len, sizeof(rec.key.len));
					h = km_fnv1a(h, rec.key.p, rec.key.len > 0 ? (size_t)rec.key.len : 0);
					h = km_fnv1a(h, &rec.value.len, sizeof(rec.value.len));
					h = km_fnv1a(h, rec.value.p, rec.value.len > 0 ? (size_t)rec.value.len : 0);
					h = km_fnv1a(h, rec.headers, rec.headers_size);
					h = km_fnv1a(h, &rec.timestamp, sizeof(rec.timestamp));
					h |= 1; /* never 0 */
					break;
				}
		free(scratch);
	}
	return h;
}

/* The partition leader epoch of the batch holding offset, -1 when none of the batches holds it. */
static int32_t batch_epoch(const km_bytes *records, int64_t offset)
{
	km_batch_iter it;
	km_batch b;

	km_batch_iter_init(&it, records->p, records->len > 0 ? (size_t)records->len : 0);
	while (km_batch_next(&it, &b))
		if (offset >= b.base_offset && offset <= b.base_offset + b.last_offset_delta)
			return b.partition_leader_epoch;
	return -1;
}

static void on_record_probe(km_net_client *c, const km_rpc_response *res, void *arg)
{
	km_pipeline *pl;
	lo_ctx lc;
	mpart *p = km_pl_answer_part(arg, &pl, &lc);
	const km_fetch_response *r = res->msg;
	km_err err = km_rpc_transport_err(res);
	bool dest = lc.dest;
	int64_t offset = lc.tag;
	bool ok = false;

	if (!p)
		return;
	p->fb.pending--;
	if (p->fb.check != FB_PROBING) {
		/* The other probe failed: asked again once this one is in. */
		if (!p->fb.pending && p->phase == PH_START_WAIT)
			km_pl_set_phase(p, PH_START, "the other probe failed: asked again");
		return;
	}
	if (err == KM_OK) {
		if (r && r->responses.count == 1 && r->responses.items[0].partitions.count == 1) {
			const km_fetch_response_partition_data *pd = &r->responses.items[0].partitions.items[0];
			ok = pd->error_code == 0 || pd->error_code == 1; /* out of range: not there (retention) */
			if (!pd->error_code) {
				p->fb.hash[dest ? 0 : 1] = record_hash(&pd->records, offset);
				*(dest ? &p->fb.here_epoch : &p->fb.src_epoch) = batch_epoch(&pd->records, offset);
			}
		}
	} else {
		km_cluster_drop(dest ? pl->dst : pl->src, c);
	}
	if (!ok) {
		p->fb.check = FB_UNCHECKED; /* asked again */
		km_pl_backoff(p);
	}
	if (!p->fb.pending && p->fb.check == FB_PROBING) {
		char tag[300];
		/* A record gone on either side (retention, compaction) cannot be compared: the answer is trusted. */
		p->fb.check = p->fb.hash[0] && p->fb.hash[1] ? FB_SAME : FB_UNDECIDABLE;
		if (p->fb.check == FB_UNDECIDABLE)
			KM_WARN(COMP, 0, "%s/%s: failback: the record before offset %lld is not on both sides to compare: "
				"trusting the source's kmirrord", pl->name, km_pl_ptag(p, tag, sizeof(tag)), (long long)offset + 1);
	}
	if (!p->fb.pending && p->phase == PH_START_WAIT)
		km_pl_set_phase(p, PH_START, "the failback probes are in");
	km_pl_tick_soon(pl);
}

/* Fetch the batch holding offset (logical at the source, physical here) for record_hash. */
static bool record_probe(km_pipeline *pl, mpart *p, bool dest, int64_t offset)
{
	if (!km_pl_one_fetch(pl, p, dest, offset, 0, on_record_probe))
		return false;
	p->fb.pending++;
	return true;
}

/* Ask the source whether it is a kmirrord that mirrored t from here (LastMirroredOffsets, any mirror). */
void km_pl_ask_peer(km_pipeline *pl, mtopic *t)
{
	km_net_client *c = km_cluster_any(pl->src);
	km_last_mirrored_offsets_request m;
	km_last_mirrored_offsets_request_topic_data td;
	req_ctx *x;
	int16_t ver;

	if (!km_cluster_usable(pl->src, c))
		return;
	if ((ver = km_net_version_pick(c, KM_API_LAST_MIRRORED_OFFSETS, 0, 0)) < 0) {
		t->peer = PEER_NONE; /* a plain Kafka cluster */
		return;
	}
	km_last_mirrored_offsets_request_init(&m);
	km_last_mirrored_offsets_request_topic_data_init(&td);
	m.mirror_name = km_str_c("");
	td.name = km_str_c(t->name);
	td.partitions.count = -1;
	m.topics.items = &td;
	m.topics.count = 1;
	if ((x = km_pl_ctx_new(pl, pl->src, -1, ver)))
		x->extra = t;
	if (km_pl_call(c, KM_API_LAST_MIRRORED_OFFSETS, ver, &m, on_peer, x) != KM_OK)
		km_cluster_drop(pl->src, c);
	else
		t->peer = PEER_ASKED;
}

/*
 * A fresh start from a kmirrord that mirrored the partition from here up to offset M and then
 * stopped (the failover): what this destination holds up to M is what it sent, at the same
 * offsets, so it stays (a run mapping it to itself); what it holds past M (its log end E: the
 * divergent tail, written here after the source's kmirrord last fetched) is hidden, and the
 * mirror fetches from M: only the delta crosses. True when it took the partition's start.
 */
bool km_pl_failback_start(km_pipeline *pl, mpart *p)
{
	int64_t end = p->out.acked_phys, k;
	km_state_run r[2];
	size_t n = 0;
	char tag[300];

	if (p->fb.peer_offset < 0)
		return false;
	if (strcmp(p->fb.peer_state, "STOPPED") && end <= 0) {
		/*
		 * Still mirrored there, and nothing here it could have come from: a hop of a chain (A -> B
		 * -> here) or a second destination, not a cycle. Mirrored from the start as from any source.
		 */
		KM_INFO(COMP, 0, "%s/%s: the source's kmirrord mirrors this topic too (%s there) and this partition is "
			"empty: a chain's next hop, mirrored from the start", pl->name, km_pl_ptag(p, tag, sizeof(tag)),
			p->fb.peer_state);
		return false;
	}
	if (strcmp(p->fb.peer_state, "STOPPED")) {
		char why[300];
		snprintf(why, sizeof(why), "the source's kmirrord mirrors this partition from here (%s there): stop that "
			 "mirror first (the failover), then start this one", p->fb.peer_state);
		km_pl_fail_part(pl, p, why);
		return true;
	}
	if (!km_uuid_is_zero(&p->t->peer_source_id) && !km_uuid_is_zero(&p->t->dst_id) &&
	    !km_uuid_eq(&p->t->peer_source_id, &p->t->dst_id)) {
		char why[600], a[23], b[23];
		km_uuid_str(&p->t->peer_source_id, a);
		km_uuid_str(&p->t->dst_id, b);
		snprintf(why, sizeof(why), "the source's kmirrord holds this topic up to offset %lld, copied from topic id %s, "
			 "but this cluster's topic of that name is %s (deleted and created again since): that topic was not "
			 "mirrored from this cluster, so no failback; to mirror it from scratch here, recreate the topic "
			 "empty and start again", (long long)p->fb.peer_offset, a, b);
		km_pl_fail_part(pl, p, why);
		return true;
	}
	k = p->fb.peer_offset < end ? p->fb.peer_offset : end;
	if (k > 0 && p->fb.check == FB_UNCHECKED) {
		/* First: was it mirrored from here? The record before k must be the same on both sides. */
		p->fb.hash[0] = p->fb.hash[1] = 0;
		p->fb.here_epoch = p->fb.src_epoch = -1;
		p->fb.pending = 0;
		p->fb.check = FB_PROBING;
		km_pl_set_phase(p, PH_START_WAIT, "failback: the record before the failback point probed on both sides");
		if (!record_probe(pl, p, true, k - 1) || !record_probe(pl, p, false, k - 1)) {
			p->fb.check = FB_UNCHECKED;
			km_pl_set_phase(p, p->fb.pending ? PH_START_WAIT : PH_START, "a failback probe could not be sent");
			km_pl_backoff(p);
		}
		return true;
	}
	if (k > 0 && p->fb.check == FB_PROBING)
		return true; /* its probes are out */
	if (k > 0 && p->fb.hash[0] != p->fb.hash[1] && p->fb.check == FB_SAME) {
		char why[600];
		snprintf(why, sizeof(why), "the source's kmirrord holds this topic up to offset %lld, but its record at %lld "
			 "differs from the one here: that topic was not mirrored from this cluster, so no failback; to "
			 "mirror it from scratch here, recreate the topic empty and start again", (long long)p->fb.peer_offset,
			 (long long)(k - 1));
		km_pl_fail_part(pl, p, why);
		return true;
	}
	if (k > 0 && k == p->fb.peer_offset && p->fb.peer_epoch >= 0 && p->fb.here_epoch >= 0 &&
	    p->fb.peer_epoch != p->fb.here_epoch) {
		char why[600];
		snprintf(why, sizeof(why), "the source's kmirrord mirrored offset %lld from this cluster in leader epoch %d, but "
			 "the batch holding it here is of leader epoch %d: this partition's log was rewritten since (an "
			 "unclean leader election here), so what is here below the failback point is not known to be what "
			 "was sent; no failback: to mirror it from scratch here, recreate the topic empty and start again",
			 (long long)(k - 1), (int)p->fb.peer_epoch, (int)p->fb.here_epoch);
		km_pl_fail_part(pl, p, why);
		return true;
	}
	if (k > 0)
		r[n++] = (km_state_run){p->t->name, p->id, 0, 0, -1, 0};
	if (end > k)
		r[n++] = (km_state_run){p->t->name, p->id, k, end, k > 0 ? k : -1, 0};
	KM_INFO(COMP, 0, "%s/%s: failback: the source's kmirrord mirrored up to offset %lld; %lld record(s) here past "
		"it are hidden, mirroring from %lld (destination offset %lld)", pl->name, km_pl_ptag(p, tag, sizeof(tag)),
		(long long)p->fb.peer_offset, (long long)(end - k), (long long)k, (long long)end);
	p->plan.fetch_logical = p->out.acked_logical = p->plan.first_logical = k;
	p->out.acked_epoch = p->fb.src_epoch; /* the source's own epoch of its batch before k, read by the compare */
	p->plan.cont_logical = n ? k : -1;
	p->plan.cont_lat = false;
	km_pl_set_tail(pl, p, true);
	if (n)
		km_pl_run_then(pl, p, r, n, PH_READY);
	else
		km_pl_set_phase(p, PH_READY, "failback: the divergent tail hidden");
	return true;
}
