/* The operator's log of refusals on read-only mirror topics: one line per refusal, rate-limited per topic and operation (docs/proxy.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/clock.h"
#include "kmirror/hash.h"
#include "kmirror/log.h"
#include "proxy/readonly.h"
#include "proxy/session.h"

#define KM_RO_LOG_SLOTS 128
#define KM_RO_LOG_PROBE 8

static struct ro_log_slot {
	uint64_t hash;       /* 0: free */
	uint64_t last_ms;    /* when its last line was written */
	uint32_t suppressed; /* refusals not logged since */
} ro_log_slots[KM_RO_LOG_SLOTS];

static uint64_t ro_log_hash(km_str topic, km_ro_op op)
{
	uint64_t h = km_fnv1a(KM_FNV1A_INIT ^ (uint64_t)op, topic.p, topic.len > 0 ? (size_t)topic.len : 0);
	return h ? h : 1;
}

bool km_ro_log_allow(km_str topic, km_ro_op op, uint64_t now_ms, uint32_t *suppressed)
{
	uint64_t h = ro_log_hash(topic, op);
	size_t first = (size_t)(h % KM_RO_LOG_SLOTS), victim = first;
	struct ro_log_slot *sl;

	*suppressed = 0;
	for (size_t i = 0; i < KM_RO_LOG_PROBE; i++) {
		sl = &ro_log_slots[(first + i) % KM_RO_LOG_SLOTS];
		if (sl->hash == h) {
			if (now_ms - sl->last_ms < KM_RO_LOG_INTERVAL_MS) {
				sl->suppressed++;
				return false;
			}
			*suppressed = sl->suppressed;
			sl->suppressed = 0;
			sl->last_ms = now_ms;
			return true;
		}
		if (!sl->hash) {
			victim = (first + i) % KM_RO_LOG_SLOTS;
			break;
		}
		if (sl->last_ms < ro_log_slots[victim].last_ms)
			victim = (first + i) % KM_RO_LOG_SLOTS;
	}
	sl = &ro_log_slots[victim];
	*sl = (struct ro_log_slot){.hash = h, .last_ms = now_ms};
	return true;
}

static const char *const ro_op_api[] = {"Produce", "DeleteRecords", "DeleteTopics", "CreatePartitions", "CreateTopics",
					"AddPartitionsToTxn"};

/*
 * One line (at most one per topic and operation every KM_RO_LOG_INTERVAL_MS) saying who was
 * refused what and why: the client's id and session (its connection's log lines carry the same
 * session), the request's version, the partitions, the code and the message the client got.
 */
void km_ro_log_refusal(const km_req *rq, km_ro_op op, km_str topic, const km_uuid *id, const km_ro_part *parts,
		       int32_t nparts, km_err code, const char *message, const char *extra)
{
	char pl[160] = "", idtxt[40] = "", more[96] = "";
	char cidtxt[KM_LOG_ESCAPED_SIZE(64)], topictxt[KM_LOG_ESCAPED_SIZE(256)];
	km_req_header full;
	km_str cid = {"", 0};
	uint32_t suppressed;
	size_t n = 0;

	if (KM_LOG_INFO > km_log_current || !km_ro_log_allow(topic.len >= 0 ? topic : km_str_c(""), op, (uint64_t)km_mono_ms(), &suppressed))
		return;
	/*
	 * The session parsed the header's fixed part only: the client id is read here, on refusals
	 * only, from the pulled-up head (the whole header is in it: classify had it, or the frame).
	 */
	if (km_net_parse_request_header(rq->body, rq->body_len,
					km_proxy_request_header_version(rq->h->api_key, rq->h->api_version), &full) == KM_OK &&
	    full.client_id.len > 0)
		cid = full.client_id;
	for (int32_t j = 0; parts && j < nparts && n < sizeof(pl) - 16; j++) {
		if (parts[j].code == KM_OK)
			continue;
		int w = snprintf(pl + n, sizeof(pl) - n, "%s%d", n ? "," : " partition ", parts[j].index);
		n += w > 0 ? (size_t)w : 0;
		if (n >= sizeof(pl) - 16 && j + 1 < nparts)
			snprintf(pl + n, sizeof(pl) - n, ",...");
	}
	if (id && topic.len <= 0) {
		static const char hex[] = "0123456789abcdef";
		for (int i = 0; i < 16; i++) {
			idtxt[2 * i] = hex[id->b[i] >> 4];
			idtxt[2 * i + 1] = hex[id->b[i] & 15];
		}
		idtxt[32] = '\0';
	}
	if (suppressed)
		snprintf(more, sizeof(more), " (and %u more refusals of this topic since the last line)", suppressed);
	/*
	 * The client id and the topic's name are the client's bytes: escaped, so they cannot break or
	 * forge the line, and bounded (cut with "..." past what the buffers hold).
	 */
	km_log_escape(cidtxt, sizeof(cidtxt), cid.p, cid.len);
	km_log_escape(topictxt, sizeof(topictxt), topic.p, idtxt[0] ? 0 : topic.len);
	KM_INFO("proxy", km_session_id(rq->s), "refused %s v%d (client id \"%s\") on %s%s%s%s: %s: %s%s%s%s",
		ro_op_api[op], rq->h->api_version, cidtxt, idtxt[0] ? "topic id " : "topic ", topictxt, idtxt, pl,
		km_err_name(code), message ? message : "", extra ? "; " : "", extra ? extra : "", more);
}

void km_ro_log_produce(const km_req *rq, const km_ro_produce *pl)
{
	for (int32_t i = 0; i < pl->ntopics; i++) {
		const km_ro_topic *t = &pl->topics[i];
		const char *msg = NULL;
		km_err code = KM_OK;
		for (int32_t j = 0; j < t->nparts && !msg; j++)
			if (t->parts[j].code != KM_OK) {
				code = t->parts[j].code;
				msg = t->parts[j].message;
			}
		if (t->nrefused > 0)
			km_ro_log_refusal(rq, KM_RO_WRITE, t->name, pl->version >= 13 ? &t->id : NULL, t->parts,
					  t->nparts, code, msg,
					  pl->acks == 0 ? "acks=0: the refused records were dropped, the client gets no answer"
							: NULL);
	}
}
