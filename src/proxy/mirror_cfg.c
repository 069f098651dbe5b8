/* The pure parts of the mirror hooks: name checks, and splitting mirror.name out of config requests and merging their answers. */
#include <stdio.h>
#include <string.h>

#include "kmirror/hash.h"

#include "proxy/mirror_rpc.h"

/* Kafka's limit on a topic name (Topic.MAX_NAME_LENGTH). */
#define KM_MIRROR_MAX_NAME 249
/* AlterableConfig.ConfigOperation values. */
enum { KM_OP_SET = 0, KM_OP_DELETE = 1, KM_OP_APPEND = 2, KM_OP_SUBTRACT = 3 };

static bool ends_with(km_str s, const char *suffix)
{
	size_t n = strlen(suffix);
	return s.len >= 0 && (size_t)s.len >= n && memcmp(s.p + s.len - n, suffix, n) == 0;
}

km_err km_mirror_check_name(km_str name, const char *what, char *err, size_t errlen)
{
	if (name.len <= 0) {
		snprintf(err, errlen, "%s name is empty", what);
		return KM_KAFKA_INVALID_REQUEST;
	}
	/* The characters first: the other reasons quote the name, which may then hold only these. */
	for (int32_t i = 0; i < name.len; i++) {
		unsigned char c = (unsigned char)name.p[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
		      c == '_' || c == '-')) {
			/* Printed as a code: the name may hold anything, the message must not. */
			snprintf(err, errlen,
				 "%s name has an invalid character (byte 0x%02x at %d): only ASCII letters, digits, "
				 "'.', '_' and '-' are allowed",
				 what, c, (int)i);
			return KM_KAFKA_INVALID_REQUEST;
		}
	}
	if (name.len > KM_MIRROR_MAX_NAME) {
		snprintf(err, errlen, "%s name '%.40s...' is %d characters long: at most %d are allowed", what, name.p,
			 (int)name.len, KM_MIRROR_MAX_NAME);
		return KM_KAFKA_INVALID_REQUEST;
	}
	if ((name.len == 1 && name.p[0] == '.') || (name.len == 2 && name.p[0] == '.' && name.p[1] == '.')) {
		snprintf(err, errlen, "%s name '%.*s' is not allowed", what, (int)name.len, name.p);
		return KM_KAFKA_INVALID_REQUEST;
	}
	if (strcmp(what, "mirror") == 0 &&
	    (ends_with(name, KM_MIRROR_PAUSED_SUFFIX) || ends_with(name, KM_MIRROR_REMOVED_SUFFIX))) {
		snprintf(err, errlen, "mirror name '%.*s' ends in %s or %s, which mirror.name gives a meaning",
			 (int)name.len, name.p, KM_MIRROR_PAUSED_SUFFIX, KM_MIRROR_REMOVED_SUFFIX);
		return KM_KAFKA_INVALID_REQUEST;
	}
	return KM_OK;
}

/* The km_str at item i of an array of structs (stride bytes each, the string at off). */
static km_str str_at(const void *items, size_t stride, size_t off, size_t i)
{
	km_str s;
	memcpy(&s, (const char *)items + i * stride + off, sizeof(s));
	return s;
}

km_err km_str_first_dup(const void *items, size_t n, size_t stride, size_t off, size_t *dup)
{
	size_t cap = 16, *slot;

	*dup = n;
	while (cap < 2 * n)
		cap *= 2;
	/* Open addressing over indices + 1 (0: free): one pass, linear in the names' total length. */
	if (!(slot = calloc(cap, sizeof(*slot))))
		return KM_ERR_NOMEM;
	for (size_t i = 0; i < n && *dup == n; i++) {
		km_str s = str_at(items, stride, off, i);
		size_t h = (size_t)km_fnv1a(KM_FNV1A_INIT, s.p, s.len > 0 ? (size_t)s.len : 0) & (cap - 1);
		for (;; h = (h + 1) & (cap - 1)) {
			if (!slot[h]) {
				slot[h] = i + 1;
				break;
			}
			if (km_str_eq(str_at(items, stride, off, slot[h] - 1), s)) {
				*dup = i;
				break;
			}
		}
	}
	free(slot);
	return KM_OK;
}

km_err km_mirror_check_names(const km_str *names, size_t n, const char *what, char *err, size_t errlen)
{
	size_t dup;
	for (size_t i = 0; i < n; i++) {
		km_err rc = km_mirror_check_name(names[i], what, err, errlen);
		if (rc != KM_OK)
			return rc;
	}
	if (km_str_first_dup(names, n, sizeof(*names), 0, &dup) != KM_OK)
		return KM_ERR_NOMEM;
	if (dup < n) {
		snprintf(err, errlen, "%s '%.*s' is named more than once", what, (int)names[dup].len, names[dup].p);
		return KM_KAFKA_INVALID_REQUEST;
	}
	return KM_OK;
}

static km_str arena_str(km_arena *a, const char *s, size_t n)
{
	char *p = km_arena_alloc(a, n + 1);
	if (!p)
		return KM_STR_NULL;
	memcpy(p, s, n);
	p[n] = '\0';
	return (km_str){p, (int32_t)n};
}

void km_mcfg_set(km_mcfg_split *sp, int32_t i, int16_t code, const char *message, km_arena *a)
{
	sp->res[i].code = code;
	sp->res[i].message = message ? arena_str(a, message, strlen(message)) : KM_STR_NULL;
}

/* A mirror.name entry's meaning; false with err when it has none. */
static bool parse_value(int8_t op, km_str value, km_mcfg_res *r, char *err, size_t errlen)
{
	char sub[300];
	if (op == KM_OP_DELETE) {
		r->kind = KM_MCFG_STOP;
		r->mirror = (km_str){"", 0};
		return true;
	}
	if (op != KM_OP_SET) {
		snprintf(err, errlen, "%s supports SET and DELETE only", KM_MIRROR_NAME_CONFIG);
		return false;
	}
	if (value.len <= 0) {
		snprintf(err, errlen, "%s needs a mirror name (m, m%s or m%s)", KM_MIRROR_NAME_CONFIG,
			 KM_MIRROR_PAUSED_SUFFIX, KM_MIRROR_REMOVED_SUFFIX);
		return false;
	}
	r->kind = KM_MCFG_SET;
	r->mirror = value;
	if (ends_with(value, KM_MIRROR_PAUSED_SUFFIX)) {
		r->kind = KM_MCFG_PAUSE;
		r->mirror.len -= (int32_t)strlen(KM_MIRROR_PAUSED_SUFFIX);
	} else if (ends_with(value, KM_MIRROR_REMOVED_SUFFIX)) {
		r->kind = KM_MCFG_STOP;
		r->mirror.len -= (int32_t)strlen(KM_MIRROR_REMOVED_SUFFIX);
	}
	if (km_mirror_check_name(r->mirror, "mirror", sub, sizeof(sub)) != KM_OK) {
		snprintf(err, errlen, "%s: %s", KM_MIRROR_NAME_CONFIG, sub);
		return false;
	}
	return true;
}

static void init_res(km_mcfg_res *r)
{
	memset(r, 0, sizeof(*r));
	r->fwd = -1;
	r->auth = -1;
	r->message = KM_STR_NULL;
}

static const char state_refused[] = "written and configured only by kmirrord";

/*
 * A resource the guard refuses (state topic; a synced topic with configs other than mirror.name,
 * others of them): its outcome is set and true returned.
 */
static bool guarded(const km_mcfg_guard *g, km_mcfg_split *out, int32_t i, int8_t type, km_str name, int32_t others,
		    km_arena *a)
{
	char msg[512];
	if (type != KM_RESOURCE_TOPIC)
		return false;
	if (g->state_topic && km_str_eq_c(name, g->state_topic)) {
		km_mcfg_set(out, i, KM_KAFKA_TOPIC_AUTHORIZATION_FAILED, state_refused, a);
		return true;
	}
	if (others == 0 || !g->synced || !g->synced(g->arg, name, msg, sizeof(msg)))
		return false;
	km_mcfg_set(out, i, g->code, msg, a);
	return true;
}

km_err km_mcfg_split_iac(const km_incremental_alter_configs_request *in, const km_mcfg_guard *g, km_arena *a,
			 km_mcfg_split *out)
{
	int32_t n = in->resources.count > 0 ? in->resources.count : 0;
	char err[400];

	memset(out, 0, sizeof(*out));
	km_incremental_alter_configs_request_init(&out->fwd);
	km_alter_configs_request_init(&out->fwd_legacy);
	km_incremental_alter_configs_request_init(&out->auth);
	out->fwd.validate_only = in->validate_only;
	out->nres = n;
	out->res = km_arena_calloc(a, (size_t)n * sizeof(*out->res) + 1);
	out->fwd.resources.items = km_arena_calloc(a, (size_t)n * sizeof(*out->fwd.resources.items) + 1);
	if (!out->res || !out->fwd.resources.items)
		return KM_ERR_NOMEM;
	out->fwd.resources.count = 0;
	for (int32_t i = 0; i < n; i++) {
		const km_incremental_alter_configs_request_alter_configs_resource *r = &in->resources.items[i];
		km_incremental_alter_configs_request_alter_configs_resource *f;
		km_mcfg_res *mr = &out->res[i];
		int32_t nc = r->configs.count > 0 ? r->configs.count : 0, seen = 0;

		init_res(mr);
		for (int32_t j = 0; j < nc; j++)
			if (km_str_eq_c(r->configs.items[j].name, KM_MIRROR_NAME_CONFIG))
				seen++;
		if (guarded(g, out, i, r->resource_type, r->resource_name, nc - seen, a)) {
			out->mine = true;
			continue;
		}
		mr->fwd = out->fwd.resources.count++;
		f = &out->fwd.resources.items[mr->fwd];
		*f = *r;
		if (r->resource_type != KM_RESOURCE_TOPIC)
			continue;
		if (!seen)
			continue;
		out->mine = true;
		/* The broker gets the rest: mirror.name never reaches it. */
		f->configs.items = km_arena_calloc(a, (size_t)nc * sizeof(*f->configs.items) + 1);
		if (!f->configs.items)
			return KM_ERR_NOMEM;
		f->configs.count = 0;
		for (int32_t j = 0; j < nc; j++) {
			const km_incremental_alter_configs_request_alterable_config *c = &r->configs.items[j];
			if (!km_str_eq_c(c->name, KM_MIRROR_NAME_CONFIG)) {
				f->configs.items[f->configs.count++] = *c;
				continue;
			}
			if (seen > 1) {
				snprintf(err, sizeof(err), "%s is given %d times", KM_MIRROR_NAME_CONFIG, (int)seen);
				km_mcfg_set(out, i, KM_KAFKA_INVALID_REQUEST, err, a);
				mr->kind = KM_MCFG_NONE;
				break;
			}
			if (!parse_value(c->config_operation, c->value, mr, err, sizeof(err))) {
				km_mcfg_set(out, i, KM_KAFKA_INVALID_CONFIG, err, a);
				mr->kind = KM_MCFG_NONE;
			}
		}
		/* A refused mirror.name refuses the resource: nothing of it goes to the broker. */
		if (mr->code != 0) {
			out->fwd.resources.count--;
			mr->fwd = -1;
		}
	}
	return km_arena_err(a);
}

km_err km_mcfg_split_ac(const km_alter_configs_request *in, const km_mcfg_guard *g, km_arena *a,
			km_mcfg_split *out)
{
	int32_t n = in->resources.count > 0 ? in->resources.count : 0;
	char err[400];

	memset(out, 0, sizeof(*out));
	km_incremental_alter_configs_request_init(&out->fwd);
	km_alter_configs_request_init(&out->fwd_legacy);
	km_incremental_alter_configs_request_init(&out->auth);
	out->fwd_legacy.validate_only = in->validate_only;
	out->auth.validate_only = true;
	out->nres = n;
	out->res = km_arena_calloc(a, (size_t)n * sizeof(*out->res) + 1);
	out->fwd_legacy.resources.items = km_arena_calloc(a, (size_t)n * sizeof(*out->fwd_legacy.resources.items) + 1);
	out->auth.resources.items = km_arena_calloc(a, (size_t)n * sizeof(*out->auth.resources.items) + 1);
	if (!out->res || !out->fwd_legacy.resources.items || !out->auth.resources.items)
		return KM_ERR_NOMEM;
	out->fwd_legacy.resources.count = 0;
	out->auth.resources.count = 0;
	for (int32_t i = 0; i < n; i++) {
		const km_alter_configs_request_alter_configs_resource *r = &in->resources.items[i];
		km_alter_configs_request_alter_configs_resource *f;
		km_mcfg_res *mr = &out->res[i];
		int32_t nc = r->configs.count > 0 ? r->configs.count : 0, seen = 0;

		init_res(mr);
		if (r->resource_type == KM_RESOURCE_TOPIC)
			for (int32_t j = 0; j < nc; j++)
				if (km_str_eq_c(r->configs.items[j].name, KM_MIRROR_NAME_CONFIG))
					seen++;
		/* The legacy request replaces every config: even none but mirror.name would clear the rest. */
		if (guarded(g, out, i, r->resource_type, r->resource_name, seen ? nc - seen : 1, a)) {
			out->mine = true;
			continue;
		}
		if (!seen) {
			mr->fwd = out->fwd_legacy.resources.count++;
			out->fwd_legacy.resources.items[mr->fwd] = *r;
			continue;
		}
		out->mine = true;
		if (seen > 1) {
			snprintf(err, sizeof(err), "%s is given %d times", KM_MIRROR_NAME_CONFIG, (int)seen);
			km_mcfg_set(out, i, KM_KAFKA_INVALID_REQUEST, err, a);
			continue;
		}
		f = &out->fwd_legacy.resources.items[out->fwd_legacy.resources.count];
		*f = *r;
		f->configs.items = km_arena_calloc(a, (size_t)nc * sizeof(*f->configs.items) + 1);
		if (!f->configs.items)
			return KM_ERR_NOMEM;
		f->configs.count = 0;
		for (int32_t j = 0; j < nc; j++) {
			const km_alter_configs_request_alterable_config *c = &r->configs.items[j];
			if (!km_str_eq_c(c->name, KM_MIRROR_NAME_CONFIG)) {
				f->configs.items[f->configs.count++] = *c;
				continue;
			}
			/* The legacy request has no DELETE: a null value removes the config. */
			if (!parse_value(c->value.len < 0 ? KM_OP_DELETE : KM_OP_SET, c->value, mr, err, sizeof(err)))
				km_mcfg_set(out, i, KM_KAFKA_INVALID_CONFIG, err, a);
		}
		if (mr->code != 0) {
			mr->kind = KM_MCFG_NONE;
			continue;
		}
		if (f->configs.count > 0) {
			/* The other configs replace the topic's as the legacy request does; the broker's answer authorizes. */
			mr->fwd = out->fwd_legacy.resources.count++;
		} else {
			/* Never an empty set in its place (that would clear the topic's configs): a probe authorizes. */
			km_incremental_alter_configs_request_alter_configs_resource *p;
			mr->auth = out->auth.resources.count++;
			p = &out->auth.resources.items[mr->auth];
			km_incremental_alter_configs_request_alter_configs_resource_init(p);
			p->resource_type = r->resource_type;
			p->resource_name = r->resource_name;
			p->configs.count = 0;
		}
	}
	return km_arena_err(a);
}

static void take_one(km_mcfg_res *mr, int16_t code, km_str msg, km_arena *a)
{
	if (mr->code != 0)
		return;
	mr->code = code;
	mr->message = code != 0 && msg.len > 0 ? arena_str(a, msg.p, (size_t)msg.len) : KM_STR_NULL;
	/* Every error carries a message, even when the broker gave none. */
	if (code != 0 && mr->message.len <= 0)
		mr->message = arena_str(a, "refused by the broker", strlen("refused by the broker"));
}

/*
 * A broker answers config resources in its own order (refused ones first, then the controller's map
 * order; a duplicated resource gets one answer): results are matched to what was sent by type and
 * name, never by position, so no resource takes another's verdict.
 */
km_err km_mcfg_take_iac(km_mcfg_split *sp, const km_incremental_alter_configs_response *r, bool auth, km_arena *a)
{
	int32_t sent = auth ? sp->auth.resources.count : sp->fwd.resources.count;
	const km_incremental_alter_configs_request_alter_configs_resource *items =
		auth ? sp->auth.resources.items : sp->fwd.resources.items;

	for (int32_t i = 0; i < sp->nres; i++) {
		int32_t k = auth ? sp->res[i].auth : sp->res[i].fwd;
		const km_incremental_alter_configs_response_alter_configs_resource_response *x = NULL;
		if (k < 0)
			continue;
		if (k >= sent)
			return KM_ERR_DECODE;
		for (int32_t j = 0; j < r->responses.count && !x; j++)
			if (r->responses.items[j].resource_type == items[k].resource_type &&
			    km_str_eq(r->responses.items[j].resource_name, items[k].resource_name))
				x = &r->responses.items[j];
		if (!x)
			return KM_ERR_DECODE;
		take_one(&sp->res[i], x->error_code, x->error_message, a);
	}
	return km_arena_err(a);
}

km_err km_mcfg_take_ac(km_mcfg_split *sp, const km_alter_configs_response *r, km_arena *a)
{
	const km_alter_configs_request_alter_configs_resource *items = sp->fwd_legacy.resources.items;

	for (int32_t i = 0; i < sp->nres; i++) {
		int32_t k = sp->res[i].fwd;
		const km_alter_configs_response_alter_configs_resource_response *x = NULL;
		if (k < 0)
			continue;
		if (k >= sp->fwd_legacy.resources.count)
			return KM_ERR_DECODE;
		for (int32_t j = 0; j < r->responses.count && !x; j++)
			if (r->responses.items[j].resource_type == items[k].resource_type &&
			    km_str_eq(r->responses.items[j].resource_name, items[k].resource_name))
				x = &r->responses.items[j];
		if (!x)
			return KM_ERR_DECODE;
		take_one(&sp->res[i], x->error_code, x->error_message, a);
	}
	return km_arena_err(a);
}

km_err km_mcfg_merge_iac(const km_incremental_alter_configs_request *in, const km_mcfg_split *sp, km_arena *a,
			 km_incremental_alter_configs_response *out)
{
	km_incremental_alter_configs_response_init(out);
	out->responses.items = km_arena_calloc(a, (size_t)sp->nres * sizeof(*out->responses.items) + 1);
	if (!out->responses.items)
		return KM_ERR_NOMEM;
	out->responses.count = sp->nres;
	for (int32_t i = 0; i < sp->nres; i++) {
		km_incremental_alter_configs_response_alter_configs_resource_response *x = &out->responses.items[i];
		km_incremental_alter_configs_response_alter_configs_resource_response_init(x);
		x->resource_type = in->resources.items[i].resource_type;
		x->resource_name = in->resources.items[i].resource_name;
		x->error_code = sp->res[i].code;
		x->error_message = sp->res[i].code ? sp->res[i].message : KM_STR_NULL;
	}
	return KM_OK;
}

km_err km_mcfg_merge_ac(const km_alter_configs_request *in, const km_mcfg_split *sp, km_arena *a,
			km_alter_configs_response *out)
{
	km_alter_configs_response_init(out);
	out->responses.items = km_arena_calloc(a, (size_t)sp->nres * sizeof(*out->responses.items) + 1);
	if (!out->responses.items)
		return KM_ERR_NOMEM;
	out->responses.count = sp->nres;
	for (int32_t i = 0; i < sp->nres; i++) {
		km_alter_configs_response_alter_configs_resource_response *x = &out->responses.items[i];
		km_alter_configs_response_alter_configs_resource_response_init(x);
		x->resource_type = in->resources.items[i].resource_type;
		x->resource_name = in->resources.items[i].resource_name;
		x->error_code = sp->res[i].code;
		x->error_message = sp->res[i].code ? sp->res[i].message : KM_STR_NULL;
	}
	return KM_OK;
}

bool km_mcfg_describe_wants(const km_describe_configs_request_describe_configs_resource *r)
{
	if (r->resource_type != KM_RESOURCE_TOPIC)
		return false;
	if (r->configuration_keys.count < 0)
		return true;
	for (int32_t i = 0; i < r->configuration_keys.count; i++)
		if (km_str_eq_c(r->configuration_keys.items[i], KM_MIRROR_NAME_CONFIG))
			return true;
	return false;
}

/* ConfigType STRING (DescribeConfigs v3+). */
#define KM_CONFIG_TYPE_STRING 2

km_err km_mcfg_describe_add(km_describe_configs_response *m, const km_str *topics, size_t n, bool synonyms,
			    km_mcfg_lookup look, void *arg, km_arena *a, int *added)
{
	*added = 0;
	for (int32_t i = 0; i < m->results.count; i++) {
		km_describe_configs_response_describe_configs_result *res = &m->results.items[i];
		km_describe_configs_response_describe_configs_resource_result *items, *e;
		char value[300];
		bool wanted = false;

		if (res->resource_type != KM_RESOURCE_TOPIC || res->error_code != 0)
			continue;
		for (size_t j = 0; j < n && !wanted; j++)
			wanted = km_str_eq(res->resource_name, topics[j]);
		if (!wanted || !look(arg, res->resource_name, value, sizeof(value)))
			continue;
		if (res->configs.count < 0)
			res->configs.count = 0;
		items = km_arena_alloc(a, ((size_t)res->configs.count + 1) * sizeof(*items));
		if (!items)
			return KM_ERR_NOMEM;
		if (res->configs.count > 0) /* none when the request named only mirror.name */
			memcpy(items, res->configs.items, (size_t)res->configs.count * sizeof(*items));
		e = &items[res->configs.count];
		km_describe_configs_response_describe_configs_resource_result_init(e);
		e->name = km_str_c(KM_MIRROR_NAME_CONFIG);
		e->value = arena_str(a, value, strlen(value));
		e->read_only = true;
		e->config_source = KM_CONFIG_SOURCE_DYNAMIC_TOPIC;
		e->is_sensitive = false;
		e->config_type = KM_CONFIG_TYPE_STRING;
		e->documentation = KM_STR_NULL;
		e->synonyms.count = 0;
		if (synonyms) {
			km_describe_configs_response_describe_configs_synonym *s = km_arena_calloc(a, sizeof(*s));
			if (!s)
				return KM_ERR_NOMEM;
			km_describe_configs_response_describe_configs_synonym_init(s);
			s->name = e->name;
			s->value = e->value;
			s->source = KM_CONFIG_SOURCE_DYNAMIC_TOPIC;
			e->synonyms.items = s;
			e->synonyms.count = 1;
		}
		res->configs.items = items;
		res->configs.count++;
		(*added)++;
	}
	return km_arena_err(a);
}
