/* The option engine: everything a table of typed rows drives (defaults, parsing, files, reload checks, docs). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kmirror/options.h"

#define FIELD(obj, off, T) ((T *)((char *)(obj) + (off)))
#define CFIELD(obj, off, T) ((const T *)((const char *)(obj) + (off)))

static void errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void errf(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

const km_option *km_opt_find(const km_opt_table *t, const char *name)
{
	for (size_t i = 0; i < t->count; i++)
		if (strcmp(t->rows[i].name, name) == 0)
			return &t->rows[i];
	return NULL;
}

const char *km_opt_type_name(const km_option *o)
{
	switch (o->type) {
	case KM_OPT_STRING: return "string";
	case KM_OPT_INT: return "integer";
	case KM_OPT_BOOL: return "boolean";
	case KM_OPT_HOSTPORT: return "host:port";
	case KM_OPT_HOSTPORT_LIST: return "host:port list";
	case KM_OPT_ENUM: return o->choices && o->choices->type_name ? o->choices->type_name : "enum";
	}
	return "?";
}

/* A character of a host name, a dotted address or an IPv6 address (with its %zone): nothing that needs quoting. */
static bool host_char(char c)
{
	return isalnum((unsigned char)c) || c == '.' || c == '-' || c == '_' || c == ':' || c == '%';
}

/*
 * Only what km_hostport_format prints back as it came: a host of host_char (so no bracket inside
 * it, no blank the config file trims), bracketed or not (then the last colon is the port's), and a
 * port of digits only.
 */
bool km_hostport_parse(const char *s, km_hostport *hp)
{
	const char *colon, *host = s;
	size_t hlen, plen;
	unsigned long port = 0;

	if (!s || !*s)
		return false;
	if (*s == '[') {
		const char *rb = strchr(s, ']');
		if (!rb || rb[1] != ':')
			return false;
		host = s + 1;
		hlen = (size_t)(rb - host);
		colon = rb + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon)
			return false;
		hlen = (size_t)(colon - s);
	}
	if (hlen == 0 || hlen >= sizeof(hp->host))
		return false;
	for (size_t i = 0; i < hlen; i++)
		if (!host_char(host[i]))
			return false;
	plen = strlen(colon + 1);
	if (plen == 0 || plen > 5)
		return false;
	for (size_t i = 0; i < plen; i++) {
		if (!isdigit((unsigned char)colon[1 + i]))
			return false;
		port = port * 10 + (unsigned long)(colon[1 + i] - '0');
	}
	if (port > 65535)
		return false;
	memcpy(hp->host, host, hlen);
	hp->host[hlen] = '\0';
	hp->port = (uint16_t)port;
	return true;
}

void km_hostport_format(const km_hostport *hp, char *buf, size_t len)
{
	if (!hp->port && !hp->host[0])
		snprintf(buf, len, "%s", "");
	else if (strchr(hp->host, ':'))
		snprintf(buf, len, "[%s]:%u", hp->host, hp->port);
	else
		snprintf(buf, len, "%s:%u", hp->host, hp->port);
}

/* Index of value in the name table, or -1. */
static int64_t choice_index(const km_opt_enum *e, const char *value)
{
	for (size_t i = 0; i < e->count; i++)
		if ((e->match_case ? strcmp : strcasecmp)(value, e->names[i]) == 0)
			return (int64_t)i;
	return -1;
}

static void choice_error(const km_option *o, const char *value, char *err, size_t errlen)
{
	char list[512];
	size_t n = 0;
	list[0] = '\0';
	for (size_t i = 0; i < o->choices->count && n < sizeof(list); i++)
		n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "", o->choices->names[i]);
	errf(err, errlen, "%s: '%s' is not one of %s", o->name, value, list);
}

/*
 * A secret's bytes are wiped before the memory goes back to the allocator (explicit_bzero, which the
 * compiler keeps: src/core does without OpenSSL's OPENSSL_cleanse).
 */
static void free_string(const km_option *o, char **p)
{
	if (*p && o->secret)
		explicit_bzero(*p, strlen(*p));
	free(*p);
	*p = NULL;
}

static km_err set_string(const km_option *o, void *obj, const char *value, char *err, size_t errlen)
{
	char **p = FIELD(obj, o->offset, char *);
	char *dup = NULL;
	if (*value && o->choices && choice_index(o->choices, value) < 0) {
		choice_error(o, value, err, errlen);
		return KM_ERR_CONFIG;
	}
	if (*value && !(dup = strdup(value)))
		return KM_ERR_NOMEM;
	free_string(o, p);
	*p = dup;
	return KM_OK;
}

static km_err set_int(const km_option *o, void *obj, const char *value, char *err, size_t errlen)
{
	char *end;
	long long v;
	errno = 0;
	v = strtoll(value, &end, 10);
	if (errno || end == value || *end) {
		errf(err, errlen, "%s: '%s' is not an integer", o->name, value);
		return KM_ERR_CONFIG;
	}
	if (v < o->min || v > o->max) {
		errf(err, errlen, "%s: %lld is out of range [%" PRId64 ", %" PRId64 "]", o->name, v, o->min, o->max);
		return KM_ERR_CONFIG;
	}
	*FIELD(obj, o->offset, int64_t) = v;
	return KM_OK;
}

static km_err set_bool(const km_option *o, void *obj, const char *value, char *err, size_t errlen)
{
	if (!strcasecmp(value, "true") || !strcasecmp(value, "yes") || !strcmp(value, "1") || !strcasecmp(value, "on"))
		*FIELD(obj, o->offset, bool) = true;
	else if (!strcasecmp(value, "false") || !strcasecmp(value, "no") || !strcmp(value, "0") ||
		 !strcasecmp(value, "off"))
		*FIELD(obj, o->offset, bool) = false;
	else {
		errf(err, errlen, "%s: '%s' is not a boolean (true/false)", o->name, value);
		return KM_ERR_CONFIG;
	}
	return KM_OK;
}

static km_err set_hostport(const km_option *o, void *obj, const char *value, char *err, size_t errlen)
{
	km_hostport hp;
	char any[16];
	const char *text = value;
	if (!*value) {
		memset(FIELD(obj, o->offset, km_hostport), 0, sizeof(km_hostport));
		return KM_OK;
	}
	/* A listener's ":PORT" (no host) is every IPv4 address: 0.0.0.0:PORT. */
	if (value[0] == ':' && value[1] && strlen(value) <= 6 && strspn(value + 1, "0123456789") == strlen(value + 1)) {
		snprintf(any, sizeof(any), "0.0.0.0%s", value);
		text = any;
	}
	if (!km_hostport_parse(text, &hp)) {
		errf(err, errlen, "%s: '%s' is not host:port (%s)", o->name, value, KM_HOSTPORT_SYNTAX);
		return KM_ERR_CONFIG;
	}
	*FIELD(obj, o->offset, km_hostport) = hp;
	return KM_OK;
}

/* Comma (or space) separated host:port entries, each with a port; parsed whole before anything is stored. */
static km_err set_hostport_list(const km_option *o, void *obj, const char *value, char *err, size_t errlen)
{
	size_t cap = o->max > 0 ? (size_t)o->max : 0, n = 0;
	km_hostport *list = cap ? calloc(cap, sizeof(*list)) : NULL;
	const char *p = value;
	km_err rc = KM_OK;

	if (cap && !list)
		return KM_ERR_NOMEM;
	while (*p) {
		char item[300];
		size_t len;
		while (*p == ' ' || *p == ',')
			p++;
		if (!*p)
			break;
		len = strcspn(p, ", ");
		if (len >= sizeof(item) || n == cap) {
			errf(err, errlen, "%s: entry too long or more than %zu entries", o->name, cap);
			rc = KM_ERR_CONFIG;
			goto out;
		}
		memcpy(item, p, len);
		item[len] = '\0';
		if (!km_hostport_parse(item, &list[n]) || list[n].port == 0) {
			errf(err, errlen, "%s: '%s' is not host:port (%s, the port not 0)", o->name, item,
			     KM_HOSTPORT_SYNTAX);
			rc = KM_ERR_CONFIG;
			goto out;
		}
		n++;
		p += len;
	}
	if (n)
		memcpy(FIELD(obj, o->offset, km_hostport), list, n * sizeof(*list));
	*FIELD(obj, o->count_offset, int) = (int)n;
out:
	free(list);
	return rc;
}

static km_err set_enum(const km_option *o, void *obj, const char *value, char *err, size_t errlen)
{
	int64_t i = choice_index(o->choices, value);
	if (i < 0) {
		choice_error(o, value, err, errlen);
		return KM_ERR_CONFIG;
	}
	*FIELD(obj, o->offset, int64_t) = i;
	return KM_OK;
}

km_err km_opt_set_row(const km_option *o, void *obj, const char *value, char *err, size_t errlen)
{
	switch (o->type) {
	case KM_OPT_STRING: return set_string(o, obj, value, err, errlen);
	case KM_OPT_INT: return set_int(o, obj, value, err, errlen);
	case KM_OPT_BOOL: return set_bool(o, obj, value, err, errlen);
	case KM_OPT_HOSTPORT: return set_hostport(o, obj, value, err, errlen);
	case KM_OPT_HOSTPORT_LIST: return set_hostport_list(o, obj, value, err, errlen);
	case KM_OPT_ENUM: return set_enum(o, obj, value, err, errlen);
	}
	errf(err, errlen, "%s: unknown option type", o->name);
	return KM_ERR_CONFIG;
}

km_err km_opt_set(const km_opt_table *t, void *obj, const char *name, const char *value, char *err, size_t errlen)
{
	const km_option *o = km_opt_find(t, name);
	if (!o) {
		errf(err, errlen, "unknown option '%s'", name);
		return KM_ERR_CONFIG;
	}
	return km_opt_set_row(o, obj, value, err, errlen);
}

km_err km_opt_init(const km_opt_table *t, void *obj)
{
	km_err rc = KM_OK;
	memset(obj, 0, t->size);
	for (size_t i = 0; i < t->count; i++) {
		km_err one = km_opt_set_row(&t->rows[i], obj, t->rows[i].def, NULL, 0);
		if (one != KM_OK && rc == KM_OK)
			rc = one;
	}
	return rc;
}

void km_opt_free(const km_opt_table *t, void *obj)
{
	for (size_t i = 0; i < t->count; i++) {
		if (t->rows[i].type == KM_OPT_STRING)
			free_string(&t->rows[i], FIELD(obj, t->rows[i].offset, char *));
	}
}

km_err km_opt_copy(const km_opt_table *t, void *dst, const void *src)
{
	memcpy(dst, src, t->size);
	for (size_t i = 0; i < t->count; i++) {
		char **p;
		if (t->rows[i].type != KM_OPT_STRING)
			continue;
		p = FIELD(dst, t->rows[i].offset, char *);
		if (*p && !(*p = strdup(*p))) {
			/* Free the copies made so far, and leave the rest of dst without strings. */
			for (size_t j = i + 1; j < t->count; j++)
				if (t->rows[j].type == KM_OPT_STRING)
					*FIELD(dst, t->rows[j].offset, char *) = NULL;
			km_opt_free(t, dst);
			return KM_ERR_NOMEM;
		}
	}
	return KM_OK;
}

static char *trim(char *s)
{
	char *e;
	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

/* Apply one line of a file; blank and comment lines do nothing. */
static km_err load_line(const km_opt_table *t, void *obj, char *line, char *err, size_t errlen)
{
	char *s = trim(line), *eq, *key, *val;
	size_t vlen;

	if (!*s || *s == '#')
		return KM_OK;
	eq = strchr(s, '=');
	if (!eq) {
		errf(err, errlen, "expected 'key = value'");
		return KM_ERR_CONFIG;
	}
	*eq = '\0';
	key = trim(s);
	val = trim(eq + 1);
	/* Allow "quoted values" so an empty string can be written explicitly. */
	vlen = strlen(val);
	if (vlen >= 2 && val[0] == '"' && val[vlen - 1] == '"') {
		val[vlen - 1] = '\0';
		val++;
	}
	return km_opt_set(t, obj, key, val, err, errlen);
}

/*
 * The next line of f into *buf, without its newline; *len its length (a NUL byte in it makes
 * strlen shorter). A line may be of any length: --print-config prints a value whole, and what it
 * prints must load. *buf grows as needed, the copy left behind wiped (a line may hold a secret).
 * 1: a line, 0: the end of the file, -1: out of memory.
 */
static int next_line(FILE *f, char **buf, size_t *cap, size_t *len)
{
	int c;

	*len = 0;
	while ((c = getc(f)) != EOF && c != '\n') {
		if (*len + 1 >= *cap) {
			size_t ncap = *cap ? *cap * 2 : 256;
			char *nb = malloc(ncap);
			if (!nb)
				return -1;
			if (*buf) {
				memcpy(nb, *buf, *len);
				explicit_bzero(*buf, *cap);
				free(*buf);
			}
			*buf = nb;
			*cap = ncap;
		}
		(*buf)[(*len)++] = (char)c;
	}
	if (c == EOF && *len == 0)
		return 0;
	if (!*buf && !(*buf = malloc(*cap = 1)))
		return -1;
	(*buf)[*len] = '\0';
	return 1;
}

km_err km_opt_load_file(const km_opt_table *t, void *obj, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char *line = NULL, sub[512];
	size_t cap = 0, len;
	int lineno = 0, got;
	void *work;
	km_err rc;

	if (!f) {
		errf(err, errlen, "%s: %s", path, strerror(errno));
		return KM_ERR_CONFIG;
	}
	/* Lines go into a copy, so a bad line leaves obj as it was. */
	work = malloc(t->size);
	if (!work || (rc = km_opt_copy(t, work, obj)) != KM_OK) {
		free(work);
		fclose(f);
		errf(err, errlen, "%s: out of memory", path);
		return KM_ERR_NOMEM;
	}
	while ((got = next_line(f, &line, &cap, &len)) > 0) {
		lineno++;
		if (strlen(line) != len) {
			snprintf(sub, sizeof(sub), "a NUL byte in the line");
			rc = KM_ERR_CONFIG;
		} else {
			rc = load_line(t, work, line, sub, sizeof(sub));
		}
		if (rc != KM_OK) {
			errf(err, errlen, "%s:%d: %s", path, lineno, sub);
			break;
		}
	}
	if (got < 0) {
		errf(err, errlen, "%s: out of memory", path);
		rc = KM_ERR_NOMEM;
	}
	fclose(f);
	if (line)
		explicit_bzero(line, cap); /* the last line read may be a secret's */
	free(line);
	if (rc == KM_OK) {
		km_opt_free(t, obj);
		memcpy(obj, work, t->size);
	} else {
		km_opt_free(t, work);
	}
	free(work);
	return rc;
}

static bool str_eq(const char *a, const char *b)
{
	if (!a || !b)
		return a == b;
	return strcmp(a, b) == 0;
}

static bool hostport_eq(const km_hostport *x, const km_hostport *y)
{
	return x->port == y->port && strcmp(x->host, y->host) == 0;
}

bool km_opt_equal(const km_option *o, const void *a, const void *b)
{
	switch (o->type) {
	case KM_OPT_STRING:
		return str_eq(*CFIELD(a, o->offset, char *), *CFIELD(b, o->offset, char *));
	case KM_OPT_INT:
	case KM_OPT_ENUM:
		return *CFIELD(a, o->offset, int64_t) == *CFIELD(b, o->offset, int64_t);
	case KM_OPT_BOOL:
		return *CFIELD(a, o->offset, bool) == *CFIELD(b, o->offset, bool);
	case KM_OPT_HOSTPORT:
		return hostport_eq(CFIELD(a, o->offset, km_hostport), CFIELD(b, o->offset, km_hostport));
	case KM_OPT_HOSTPORT_LIST: {
		int n = *CFIELD(a, o->count_offset, int);
		const km_hostport *x = CFIELD(a, o->offset, km_hostport), *y = CFIELD(b, o->offset, km_hostport);
		if (n != *CFIELD(b, o->count_offset, int))
			return false;
		for (int i = 0; i < n; i++)
			if (!hostport_eq(&x[i], &y[i]))
				return false;
		return true;
	}
	}
	return false;
}

km_err km_opt_check_reload(const km_opt_table *t, const void *cur, const void *next, char *err, size_t errlen)
{
	for (size_t i = 0; i < t->count; i++) {
		if (!t->rows[i].reloadable && !km_opt_equal(&t->rows[i], cur, next)) {
			errf(err, errlen, "%s cannot change on reload (restart needed)", t->rows[i].name);
			return KM_ERR_CONFIG;
		}
	}
	return KM_OK;
}

void km_opt_format(const km_option *o, const void *obj, char *buf, size_t len)
{
	buf[0] = '\0';
	switch (o->type) {
	case KM_OPT_STRING: {
		const char *s = *CFIELD(obj, o->offset, char *);
		snprintf(buf, len, "%s", s ? (o->secret ? KM_OPT_SECRET_MASK : s) : "");
		break;
	}
	case KM_OPT_INT:
		snprintf(buf, len, "%" PRId64, *CFIELD(obj, o->offset, int64_t));
		break;
	case KM_OPT_BOOL:
		snprintf(buf, len, "%s", *CFIELD(obj, o->offset, bool) ? "true" : "false");
		break;
	case KM_OPT_HOSTPORT:
		km_hostport_format(CFIELD(obj, o->offset, km_hostport), buf, len);
		break;
	case KM_OPT_HOSTPORT_LIST: {
		const km_hostport *list = CFIELD(obj, o->offset, km_hostport);
		int count = *CFIELD(obj, o->count_offset, int);
		size_t n = 0;
		for (int i = 0; i < count && n < len; i++) {
			char one[300];
			km_hostport_format(&list[i], one, sizeof(one));
			n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? "," : "", one);
		}
		break;
	}
	case KM_OPT_ENUM: {
		int64_t v = *CFIELD(obj, o->offset, int64_t);
		snprintf(buf, len, "%s", v >= 0 && (uint64_t)v < o->choices->count ? o->choices->names[v] : "?");
		break;
	}
	}
}

/*
 * Whether a string must go in double quotes to load back as it is: load_line trims the value, then
 * drops one pair of quotes around it.
 */
static bool needs_quotes(const char *s)
{
	size_t n = strlen(s);
	return n && (isspace((unsigned char)s[0]) || isspace((unsigned char)s[n - 1]) ||
		     (n >= 2 && s[0] == '"' && s[n - 1] == '"'));
}

/* One value onto out, whole: a string or a list may be longer than any buffer km_opt_format is given. */
static void write_value(const km_option *o, const void *obj, FILE *out)
{
	char v[512];

	if (o->type == KM_OPT_STRING) {
		const char *s = *CFIELD(obj, o->offset, char *);
		s = s ? (o->secret ? KM_OPT_SECRET_MASK : s) : "";
		fprintf(out, needs_quotes(s) ? "\"%s\"" : "%s", s);
	} else if (o->type == KM_OPT_HOSTPORT_LIST) {
		const km_hostport *list = CFIELD(obj, o->offset, km_hostport);
		int count = *CFIELD(obj, o->count_offset, int);
		for (int i = 0; i < count; i++) {
			km_hostport_format(&list[i], v, sizeof(v));
			fprintf(out, "%s%s", i ? "," : "", v);
		}
	} else {
		/* An integer, a boolean, an enum's name or one host:port: short. */
		km_opt_format(o, obj, v, sizeof(v));
		fputs(v, out);
	}
}

void km_opt_write_values(const km_opt_table *t, const void *obj, FILE *out)
{
	for (size_t i = 0; i < t->count; i++) {
		fprintf(out, "%s = ", t->rows[i].name);
		write_value(&t->rows[i], obj, out);
		fputc('\n', out);
	}
}

void km_opt_write_doc(const km_opt_table *t, FILE *out)
{
	fprintf(out, "| option | type | default | reloadable | description |\n");
	fprintf(out, "| --- | --- | --- | --- | --- |\n");
	for (size_t i = 0; i < t->count; i++) {
		const km_option *o = &t->rows[i];
		fprintf(out, "| `%s` | %s | %s%s%s | %s | %s |\n", o->name, km_opt_type_name(o), *o->def ? "`" : "",
			*o->def ? o->def : "(empty)", *o->def ? "`" : "", o->reloadable ? "yes" : "no", o->doc);
	}
}
