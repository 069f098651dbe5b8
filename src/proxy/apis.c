/* The proxy's API table: the features' stages composed into one row per key, and the lookup over every served key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/log.h"
#include "proxy/apis.h"

const char *const km_req_action_names[] = {"forward", "hold", "local"};
const char *const km_resp_action_names[] = {"forward", "stream", "whole", "local"};

/* ---- the table ---- */

#define KM_APIS_INDEX 256 /* keys below this are found by index; the rest by a scan */

struct km_proxy_apis {
	km_proxy_api *rows; /* sorted by key */
	size_t count, cap;
	char **notes;       /* composed rows' joined notes, owned */
	size_t nnotes;
	km_stream_hooks *streams; /* composed rows' stream stages merged (rows[i]'s at i; stable once composed) */
	int16_t index[KM_APIS_INDEX]; /* key -> row + 1, 0: none */
};

static void reindex(km_proxy_apis *t)
{
	memset(t->index, 0, sizeof(t->index));
	for (size_t i = 0; i < t->count; i++)
		if (t->rows[i].key >= 0 && t->rows[i].key < KM_APIS_INDEX)
			t->index[t->rows[i].key] = (int16_t)(i + 1);
}

km_err km_proxy_apis_set(km_proxy_apis *t, const km_proxy_api *row)
{
	size_t i = 0;
	if (row->key < 0)
		return KM_ERR_INVAL;
	while (i < t->count && t->rows[i].key < row->key)
		i++;
	if (i < t->count && t->rows[i].key == row->key) {
		t->rows[i] = *row;
		return KM_OK;
	}
	if (t->count == t->cap) {
		size_t ncap = t->cap ? t->cap * 2 : 64;
		km_proxy_api *n = realloc(t->rows, ncap * sizeof(*n));
		if (!n)
			return KM_ERR_NOMEM;
		t->rows = n;
		t->cap = ncap;
	}
	memmove(t->rows + i + 1, t->rows + i, (t->count - i) * sizeof(*t->rows));
	t->rows[i] = *row;
	t->count++;
	reindex(t);
	return KM_OK;
}

/* ---- composition ---- */

/*
 * The features in the order their stages run within a row (docs/proxy.md, "How stages compose").
 * The proxy's own stage first: it checks versions and acks on the request as the client sent it,
 * and its response hook is the innermost (endpoints are rewritten in what the broker sent). Then
 * the swap's Fetch hold (it fixes the broker's error before anything reads the partition), the
 * mirror RPCs and mirror.name (what they answer goes no further), read-only (refused partitions
 * are answered and taken out), the offsets (translated in what read-only lets through; their
 * response hook wraps the read-only merge), and the share groups' offsets.
 */
static const km_proxy_feature *const order[] = {
	&km_endpoints_feature, &km_swap_hold_feature, &km_mirror_rpc_feature, &km_mirror_name_feature,
	&km_ro_feature,        &km_off_feature,       &km_share_off_feature,
};

/*
 * Broker-listener APIs that only brokers send each other: never served to clients. A transaction
 * coordinator's WriteTxnMarkers writes control batches into any partition (a read-only mirror
 * topic's too); the share coordinator's state APIs write share-group state. A client that sends
 * one is closed, as for any API the proxy does not serve, and ApiVersions does not offer them.
 */
static bool brokers_only(int16_t key)
{
	return key == KM_API_WRITE_TXN_MARKERS || (key >= KM_API_INITIALIZE_SHARE_GROUP_STATE &&
						   key <= KM_API_READ_SHARE_GROUP_STATE_SUMMARY);
}

/* classify of a row with more than one: each stage in order, until one fails or asks for more bytes. */
static km_err stages_classify(km_req *rq)
{
	const km_proxy_api *a = rq->api;
	for (size_t i = 0; i < a->nstages; i++) {
		km_err rc = a->stages[i]->classify ? a->stages[i]->classify(rq) : KM_OK;
		if (rc != KM_OK || rq->need > rq->body_len)
			return rc;
	}
	return KM_OK;
}

/* on_request of a row with more than one: each stage in order, until one fails or answers (now or later). */
static km_err stages_request(km_req *rq)
{
	const km_proxy_api *a = rq->api;
	for (size_t i = 0; i < a->nstages; i++) {
		km_err rc = a->stages[i]->on_request ? a->stages[i]->on_request(rq) : KM_OK;
		if (rc != KM_OK || rq->answer || rq->pending)
			return rc;
	}
	return KM_OK;
}

static km_proxy_api *row_of(km_proxy_apis *t, int16_t key)
{
	km_proxy_api plain = {.key = key, .min_version = -1, .max_version = -1};
	const km_proxy_api *r = km_proxy_apis_find(t, key);
	if (!r && km_proxy_apis_set(t, &plain) != KM_OK)
		return NULL;
	return (km_proxy_api *)km_proxy_apis_find(t, key);
}

/* A stage's asks, taken into its row: the narrowest versions, the strongest request action, its response. */
static km_err add_stage(km_proxy_apis *t, const km_proxy_stage *st, const km_proxy_feature *feature)
{
	km_proxy_api *r = row_of(t, st->key);
	bool responds = st->resp != KM_RESP_FORWARD || st->rewrite || st->on_response;

	if (!r)
		return KM_ERR_NOMEM;
	if (r->nstages == KM_PROXY_STAGES_MAX || (responds && (r->resp != KM_RESP_FORWARD || r->rewrite || r->on_response)))
		return KM_ERR_INVAL;
	if (st->versions && st->min_version >= 0 && st->min_version > r->min_version)
		r->min_version = st->min_version;
	if (st->versions && st->max_version >= 0 && (r->max_version < 0 || st->max_version < r->max_version))
		r->max_version = st->max_version;
	r->shows_lower = r->shows_lower || st->shows_lower;
	if (st->req > r->req)
		r->req = st->req;
	r->in_place = r->in_place || st->in_place;
	r->needs_state = r->needs_state || feature->needs_state;
	if (!r->frame_cap)
		r->frame_cap = st->frame_cap;
	if (responds) {
		r->resp = st->resp;
		r->resp_from = st->resp_from;
		r->rewrite = st->rewrite;
		r->on_response = st->on_response;
	}
	r->stages[r->nstages] = st;
	r->features[r->nstages++] = feature->name;
	return KM_OK;
}

/* A walk event for each stage of the row that has a hook for it, in order, until one does not return KM_OK. */
static km_err stages_event(const km_stream_ev *e, bool batch)
{
	for (size_t i = 0; i < e->api->nstages; i++) {
		const km_stream_hooks *h = e->api->stages[i]->stream;
		km_err (*hook)(const km_stream_ev *) = !h ? NULL : batch ? h->on_batch : h->on_partition;
		km_err rc = hook ? hook(e) : KM_OK;
		if (rc != KM_OK)
			return rc;
	}
	return KM_OK;
}

static km_err stages_partition(const km_stream_ev *e)
{
	return stages_event(e, false);
}

static km_err stages_batch(const km_stream_ev *e)
{
	return stages_event(e, true);
}

/*
 * The row's stream hooks: per kind, the one stage's own, or the composer when several stages have
 * one. The tail is written whole at the same length, so only one stage may rewrite it.
 */
static km_err merge_stream(km_stream_hooks *m, const km_stream_hooks *h)
{
	if (h->on_tail && m->on_tail)
		return KM_ERR_INVAL;
	if (h->on_partition)
		m->on_partition = m->on_partition ? stages_partition : h->on_partition;
	if (h->on_batch)
		m->on_batch = m->on_batch ? stages_batch : h->on_batch;
	if (h->on_tail)
		m->on_tail = h->on_tail;
	return KM_OK;
}

/* Notes joined in stage order, owned by the table. */
static km_err join_notes(km_proxy_apis *t, km_proxy_api *r)
{
	size_t len = 0, n = 0;
	char *p, **notes;

	for (size_t i = 0; i < r->nstages; i++)
		if (r->stages[i]->note) {
			len += strlen(r->stages[i]->note) + 2;
			r->note = r->stages[i]->note;
			n++;
		}
	if (n < 2)
		return KM_OK;
	if (!(p = calloc(1, len + 1)) || !(notes = realloc(t->notes, (t->nnotes + 1) * sizeof(*notes)))) {
		free(p);
		return KM_ERR_NOMEM;
	}
	t->notes = notes;
	t->notes[t->nnotes++] = p;
	for (size_t i = 0; i < r->nstages; i++)
		if (r->stages[i]->note)
			p += sprintf(p, "%s%s", p == t->notes[t->nnotes - 1] ? "" : "; ", r->stages[i]->note);
	r->note = t->notes[t->nnotes - 1];
	return KM_OK;
}

/* A row's hooks once every stage is in: a lone stage's own hook, or the composer that runs them all. */
static km_err finish_row(km_proxy_apis *t, km_proxy_api *r, km_stream_hooks *stream)
{
	size_t nclassify = 0, nrequest = 0, nstream = 0;
	km_err rc = KM_OK;

	for (size_t i = 0; i < r->nstages; i++) {
		const km_proxy_stage *st = r->stages[i];
		if (st->classify && !nclassify++)
			r->classify = st->classify;
		if (st->on_request && !nrequest++)
			r->on_request = st->on_request;
		if (st->stream && !nstream++)
			r->stream = st->stream;
		if (st->stream && rc == KM_OK)
			rc = merge_stream(stream, st->stream);
	}
	if (nclassify > 1)
		r->classify = stages_classify;
	if (nrequest > 1)
		r->on_request = stages_request;
	if (nstream > 1)
		r->stream = stream;
	return rc != KM_OK ? rc : join_notes(t, r);
}

km_proxy_apis *km_proxy_apis_compose(const km_proxy_feature *const *features, size_t n)
{
	km_proxy_apis *t = calloc(1, sizeof(*t));
	size_t count;
	const km_api_info *codec = km_api_table(&count);

	if (!t)
		return NULL;
	/* Broker-listener APIs only: controller-only and broker-to-broker APIs are never advertised to clients. */
	for (size_t i = 0; i < count; i++)
		if ((codec[i].listeners & KM_API_LISTENER_BROKER) && !brokers_only(codec[i].api_key) &&
		    !row_of(t, codec[i].api_key))
			goto fail;
	for (size_t f = 0; f < n; f++)
		for (size_t i = 0; i < features[f]->count; i++)
			if (add_stage(t, &features[f]->stages[i], features[f]) != KM_OK)
				goto fail;
	if (!(t->streams = calloc(t->count, sizeof(*t->streams))))
		goto fail;
	for (size_t i = 0; i < t->count; i++)
		if (finish_row(t, &t->rows[i], &t->streams[i]) != KM_OK)
			goto fail;
	return t;
fail:
	km_proxy_apis_free(t);
	return NULL;
}

km_proxy_apis *km_proxy_apis_new(void)
{
	return km_proxy_apis_compose(order, sizeof(order) / sizeof(order[0]));
}

void km_proxy_apis_free(km_proxy_apis *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->nnotes; i++)
		free(t->notes[i]);
	free(t->notes);
	free(t->streams);
	free(t->rows);
	free(t);
}

const km_proxy_api *km_proxy_apis_find(const km_proxy_apis *t, int16_t key)
{
	if (key >= 0 && key < KM_APIS_INDEX)
		return t->index[key] ? &t->rows[t->index[key] - 1] : NULL;
	for (size_t i = 0; i < t->count; i++)
		if (t->rows[i].key == key)
			return &t->rows[i];
	return NULL;
}

size_t km_proxy_apis_count(const km_proxy_apis *t)
{
	return t->count;
}

const km_proxy_api *km_proxy_apis_at(const km_proxy_apis *t, size_t i)
{
	return &t->rows[i];
}

int16_t km_proxy_api_min(const km_proxy_api *a)
{
	const km_api_info *c = km_api_lookup(a->key);
	if (a->min_version >= 0)
		return a->min_version;
	return c ? c->min_version : 0;
}

int16_t km_proxy_api_max(const km_proxy_api *a)
{
	const km_api_info *c = km_api_lookup(a->key);
	int16_t v = c ? c->max_version : -1;
	/* A row may serve less than the codec knows (its hooks were written for older versions), never more. */
	if (a->max_version >= 0 && (!c || a->max_version < v))
		v = a->max_version;
	return v;
}

km_resp_action km_proxy_api_resp(const km_proxy_api *a, int16_t version)
{
	return version >= a->resp_from ? a->resp : KM_RESP_FORWARD;
}

const char *km_proxy_api_name(const km_proxy_api *a)
{
	const km_api_info *c = km_api_lookup(a->key);
	return a->name ? a->name : c ? c->name : "?";
}

int km_proxy_request_header_version(int16_t key, int16_t version)
{
	int v = km_api_request_header_version(key, version);
	return v < 0 ? 1 : v;
}

int km_proxy_response_header_version(int16_t key, int16_t version)
{
	/* ApiVersions answers with header v0 always, so a client can parse it before it knows versions. */
	int v = km_api_response_header_version(key, version);
	return v < 0 ? 0 : v;
}

/* The features a row's stages come from, in order ("-": a plain row, set by hand). */
static void write_stages(const km_proxy_api *a, struct evbuffer *out)
{
	for (size_t i = 0; i < a->nstages; i++)
		evbuffer_add_printf(out, "%s%s", i ? ", " : "", a->features[i]);
	if (!a->nstages)
		evbuffer_add_printf(out, "-");
}

void km_proxy_apis_write_doc(const km_proxy_apis *t, struct evbuffer *out)
{
	evbuffer_add_printf(out, "| key | API | versions | stages | request | response | what and why |\n");
	evbuffer_add_printf(out, "| --- | --- | --- | --- | --- | --- | --- |\n");
	for (size_t i = 0; i < t->count; i++) {
		const km_proxy_api *a = &t->rows[i];
		char resp[32];
		if (!a->note)
			continue; /* plain forwards: one line below the table */
		if (a->resp != KM_RESP_FORWARD && a->resp_from > km_proxy_api_min(a))
			snprintf(resp, sizeof(resp), "%s (v%d+)", km_resp_action_names[a->resp], a->resp_from);
		else
			snprintf(resp, sizeof(resp), "%s", km_resp_action_names[a->resp]);
		evbuffer_add_printf(out, "| %d | %s | %d-%d | ", a->key, km_proxy_api_name(a), km_proxy_api_min(a),
				    km_proxy_api_max(a));
		write_stages(a, out);
		evbuffer_add_printf(out, " | %s%s | %s | %s |\n", km_req_action_names[a->req],
				    a->classify ? " + classify" : "", resp, a->note);
	}
}
