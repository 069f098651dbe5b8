/* The metadata sync's filters: which consumer groups and which ACL bindings a mirror keeps in step. */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kmirror/state.h"

/* How much of an operator's text an error message quotes. */
#define QUOTE_MAX 64

/* A piece of the operator's text: not NUL-terminated. */
typedef struct span {
	const char *p;
	size_t len;
} span;

static span trim(const char *p, size_t len)
{
	while (len && (*p == ' ' || *p == '\t'))
		p++, len--;
	while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
		len--;
	return (span){p, len};
}

static int qlen(span s)
{
	return (int)(s.len > QUOTE_MAX ? QUOTE_MAX : s.len);
}

static bool is_star(span s)
{
	return s.len == 1 && s.p[0] == '*';
}

/*
 * A regex that must match the whole value. Compiled as written and checked through the match's
 * bounds rather than wrapped in "^(...)$": regcomp takes a lone ')' as a literal, so wrapping
 * "a)|b" would give "^(a)|b)$", a different and wider pattern than the operator wrote.
 */
static bool whole_compile(regex_t *re, span s, char *why, size_t whylen)
{
	char *pat = malloc(s.len + 1);
	int rc;

	if (!pat) {
		snprintf(why, whylen, "out of memory");
		return false;
	}
	memcpy(pat, s.p, s.len);
	pat[s.len] = 0;
	rc = regcomp(re, pat, REG_EXTENDED);
	free(pat);
	if (rc != 0) {
		char msg[128];
		regerror(rc, re, msg, sizeof(msg));
		snprintf(why, whylen, "not a valid regular expression (%s)", msg);
		return false;
	}
	return true;
}

/* POSIX picks the leftmost match and, from there, the longest: a whole match exists iff it is that one. */
static bool whole_match(const regex_t *re, const char *s)
{
	regmatch_t m;

	if (!s)
		s = "";
	return regexec(re, s, 1, &m, 0) == 0 && m.rm_so == 0 && (size_t)m.rm_eo == strlen(s);
}

/* ---- group names ---- */

struct km_name_filter {
	regex_t *inc;
	size_t ninc;
	regex_t *exc;
	size_t nexc;
};

static size_t count_items(const char *s, char sep)
{
	size_t n = 1;

	for (; *s; s++)
		n += *s == sep;
	return n;
}

/* One side of the filter; an all-blank list is no pattern. false with err set when refused. */
static bool parse_list(const char *what, const char *list, regex_t **out, size_t *nout, char *err, size_t errlen)
{
	const char *p;
	size_t max;

	*out = NULL;
	*nout = 0;
	if (!list || trim(list, strlen(list)).len == 0)
		return true;
	max = count_items(list, ',');
	*out = calloc(max, sizeof(**out));
	if (!*out) {
		snprintf(err, errlen, "out of memory");
		return false;
	}
	p = list;
	for (size_t i = 0; i < max; i++) {
		const char *comma = strchr(p, ',');
		span item = trim(p, comma ? (size_t)(comma - p) : strlen(p));
		char why[192];

		if (item.len == 0) {
			snprintf(err, errlen, "%s pattern %zu is empty (patterns are separated by commas)", what,
				 i + 1);
			return false;
		}
		if (!whole_compile(&(*out)[i], item, why, sizeof(why))) {
			snprintf(err, errlen, "%s pattern %zu \"%.*s\": %s", what, i + 1, qlen(item), item.p, why);
			return false;
		}
		(*nout)++;
		p = comma ? comma + 1 : p + strlen(p);
	}
	return true;
}

km_name_filter *km_name_filter_parse(const char *include, const char *exclude, char *err, size_t errlen)
{
	km_name_filter *f = calloc(1, sizeof(*f));

	if (!f) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (!parse_list("include", include, &f->inc, &f->ninc, err, errlen) ||
	    !parse_list("exclude", exclude, &f->exc, &f->nexc, err, errlen)) {
		km_name_filter_free(f);
		return NULL;
	}
	/* An empty include is no group at all: the sync of offsets is off. */
	return f;
}

bool km_name_filter_match(const km_name_filter *f, const char *name)
{
	bool in = false;

	for (size_t i = 0; i < f->ninc && !in; i++)
		in = whole_match(&f->inc[i], name);
	for (size_t i = 0; i < f->nexc && in; i++)
		in = !whole_match(&f->exc[i], name);
	return in;
}

void km_name_filter_free(km_name_filter *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->ninc; i++)
		regfree(&f->inc[i]);
	for (size_t i = 0; i < f->nexc; i++)
		regfree(&f->exc[i]);
	free(f->inc);
	free(f->exc);
	free(f);
}

/* ---- ACL bindings ---- */

typedef struct name_code {
	const char *name;
	int8_t code;
} name_code;

/* Kafka's names and wire codes (AclResourceType, AclOperation, AclPermissionType), minus UNKNOWN and ANY. */
static const name_code resource_types[] = {
	{"TOPIC", 2}, {"GROUP", 3}, {"CLUSTER", 4}, {"TRANSACTIONAL_ID", 5}, {"DELEGATION_TOKEN", 6}, {"USER", 7},
};
static const name_code operations[] = {
	{"ALL", 2},
	{"READ", 3},
	{"WRITE", 4},
	{"CREATE", 5},
	{"DELETE", 6},
	{"ALTER", 7},
	{"DESCRIBE", 8},
	{"CLUSTER_ACTION", 9},
	{"DESCRIBE_CONFIGS", 10},
	{"ALTER_CONFIGS", 11},
	{"IDEMPOTENT_WRITE", 12},
	{"CREATE_TOKENS", 13},
	{"DESCRIBE_TOKENS", 14},
	{"TWO_PHASE_COMMIT", 15},
};
static const name_code permissions[] = {{"DENY", 2}, {"ALLOW", 3}};

#define ANY_CODE (-1)
#define NFIELDS 5

typedef struct acl_rule {
	int8_t resource_type; /* ANY_CODE: any */
	int8_t operation;
	int8_t permission;
	bool has_name, has_principal; /* false: `*` */
	regex_t name, principal;
} acl_rule;

struct km_acl_scope {
	acl_rule *rules;
	size_t n;
};

typedef enum { F_TYPE, F_NAME, F_OP, F_PERM, F_PRINCIPAL } field_kind;

static const char *const field_names[NFIELDS] = {"resource type", "resource name", "operation", "permission type",
						 "principal"};

/* A name of table (case-insensitive) or `*`; false with why listing what is accepted. */
static bool parse_code(span v, const name_code *t, size_t n, int8_t *code, char *why, size_t whylen)
{
	size_t off;

	if (is_star(v)) {
		*code = ANY_CODE;
		return true;
	}
	for (size_t i = 0; i < n; i++)
		if (strlen(t[i].name) == v.len && !strncasecmp(t[i].name, v.p, v.len)) {
			*code = t[i].code;
			return true;
		}
	off = (size_t)snprintf(why, whylen, "\"%.*s\" (one of", qlen(v), v.p);
	for (size_t i = 0; i < n && off < whylen; i++)
		off += (size_t)snprintf(why + off, whylen - off, "%s %s", i ? "," : "", t[i].name);
	if (off < whylen)
		snprintf(why + off, whylen - off, "; * for any)");
	return false;
}

static bool parse_field(acl_rule *r, field_kind k, span v, char *why, size_t whylen)
{
	switch (k) {
	case F_TYPE:
		return parse_code(v, resource_types, sizeof(resource_types) / sizeof(resource_types[0]),
				  &r->resource_type, why, whylen);
	case F_OP:
		return parse_code(v, operations, sizeof(operations) / sizeof(operations[0]), &r->operation, why,
				  whylen);
	case F_PERM:
		return parse_code(v, permissions, sizeof(permissions) / sizeof(permissions[0]), &r->permission, why,
				  whylen);
	case F_NAME:
	case F_PRINCIPAL: {
		regex_t *re = k == F_NAME ? &r->name : &r->principal;
		bool *has = k == F_NAME ? &r->has_name : &r->has_principal;
		char msg[160];

		if (is_star(v))
			return true;
		if (!whole_compile(re, v, msg, sizeof(msg))) {
			snprintf(why, whylen, "\"%.*s\" is %s", qlen(v), v.p, msg);
			return false;
		}
		*has = true;
		return true;
	}
	}
	return false;
}

static void rule_free(acl_rule *r)
{
	if (r->has_name)
		regfree(&r->name);
	if (r->has_principal)
		regfree(&r->principal);
}

/* Rule number pos (1-based) from its trimmed text; false with err naming the rule and the field. */
static bool parse_rule(acl_rule *r, size_t pos, span text, char *err, size_t errlen)
{
	const char *p = text.p, *end = text.p + text.len;
	size_t nf = 0;

	r->resource_type = r->operation = r->permission = ANY_CODE;
	if (text.len == 0) {
		snprintf(err, errlen, "rule %zu is empty (rules are separated by commas)", pos);
		return false;
	}
	for (const char *q = p; q < end; q++)
		nf += *q == ';';
	if (++nf > NFIELDS) {
		snprintf(err, errlen,
			 "rule %zu \"%.*s\": %zu fields (at most 5: "
			 "resourceType;resourceName;operation;permissionType;principal)",
			 pos, qlen(text), text.p, nf);
		return false;
	}
	for (size_t f = 0; f < nf; f++) {
		const char *semi = memchr(p, ';', (size_t)(end - p));
		span v = trim(p, (size_t)((semi ? semi : end) - p));
		char why[320];

		if (v.len == 0) {
			snprintf(err, errlen, "rule %zu \"%.*s\": empty %s (* for any)", pos, qlen(text), text.p,
				 field_names[f]);
			return false;
		}
		if (!parse_field(r, (field_kind)f, v, why, sizeof(why))) {
			snprintf(err, errlen, "rule %zu \"%.*s\": %s%s %s", pos, qlen(text), text.p,
				 f == F_NAME || f == F_PRINCIPAL ? "" : "unknown ", field_names[f], why);
			return false;
		}
		p = semi ? semi + 1 : end;
	}
	return true;
}

km_acl_scope *km_acl_scope_parse(const char *spec, char *err, size_t errlen)
{
	km_acl_scope *s;
	const char *p;
	size_t max;

	if (!spec || trim(spec, strlen(spec)).len == 0) {
		/* No rule: no binding is in scope, the ACL sync is off. */
		if (!(s = calloc(1, sizeof(*s))))
			snprintf(err, errlen, "out of memory");
		return s;
	}
	max = count_items(spec, ',');
	s = calloc(1, sizeof(*s));
	if (s)
		s->rules = calloc(max, sizeof(*s->rules));
	if (!s || !s->rules) {
		free(s);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	p = spec;
	for (size_t i = 0; i < max; i++) {
		const char *comma = strchr(p, ',');
		span text = trim(p, comma ? (size_t)(comma - p) : strlen(p));

		if (!parse_rule(&s->rules[i], i + 1, text, err, errlen)) {
			rule_free(&s->rules[i]);
			km_acl_scope_free(s);
			return NULL;
		}
		s->n++;
		p = comma ? comma + 1 : p + strlen(p);
	}
	return s;
}

static bool code_ok(int8_t want, int8_t got)
{
	return want == ANY_CODE || want == got;
}

bool km_acl_scope_match(const km_acl_scope *s, int8_t resource_type, const char *resource_name, int8_t operation,
			int8_t permission, const char *principal)
{
	for (size_t i = 0; i < s->n; i++) {
		const acl_rule *r = &s->rules[i];

		if (code_ok(r->resource_type, resource_type) && code_ok(r->operation, operation) &&
		    code_ok(r->permission, permission) && (!r->has_name || whole_match(&r->name, resource_name)) &&
		    (!r->has_principal || whole_match(&r->principal, principal)))
			return true;
	}
	return false;
}

void km_acl_scope_free(km_acl_scope *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++)
		rule_free(&s->rules[i]);
	free(s->rules);
	free(s);
}
