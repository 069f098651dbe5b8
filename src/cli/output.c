/* kmirror CLI output: a small JSON writer with escaping, aligned text tables, times. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

/* ---- JSON ---- */

void km_cli_json_init(km_cli_json *j, FILE *f)
{
	memset(j, 0, sizeof(*j));
	j->f = f;
	j->first[0] = true;
}

/* Before a value: the comma between array elements (an object's comma comes before its key). */
static void before_value(km_cli_json *j)
{
	if (j->after_key) {
		j->after_key = false;
		return;
	}
	if (!j->first[j->depth])
		fputc(',', j->f);
	j->first[j->depth] = false;
}

static void open_c(km_cli_json *j, char c)
{
	before_value(j);
	fputc(c, j->f);
	if (j->depth + 1 < KM_CLI_JSON_DEPTH)
		j->depth++;
	j->first[j->depth] = true;
}

static void close_c(km_cli_json *j, char c)
{
	fputc(c, j->f);
	if (j->depth > 0)
		j->depth--;
	if (j->depth == 0)
		fputc('\n', j->f); /* one document, one line */
}

void km_cli_json_obj(km_cli_json *j) { open_c(j, '{'); }
void km_cli_json_obj_end(km_cli_json *j) { close_c(j, '}'); }
void km_cli_json_arr(km_cli_json *j) { open_c(j, '['); }
void km_cli_json_arr_end(km_cli_json *j) { close_c(j, ']'); }

void km_cli_json_key(km_cli_json *j, const char *key)
{
	if (!j->first[j->depth])
		fputc(',', j->f);
	j->first[j->depth] = false;
	km_cli_json_escape(j->f, key, strlen(key));
	fputc(':', j->f);
	j->after_key = true;
}

/* Length of the valid UTF-8 sequence at p (at most n bytes), 0 if it is not one. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
	unsigned cp;
	size_t len;

	if (p[0] < 0x80)
		return 1;
	if (p[0] >= 0xc2 && p[0] <= 0xdf)
		len = 2, cp = p[0] & 0x1f;
	else if (p[0] >= 0xe0 && p[0] <= 0xef)
		len = 3, cp = p[0] & 0x0f;
	else if (p[0] >= 0xf0 && p[0] <= 0xf4)
		len = 4, cp = p[0] & 0x07;
	else
		return 0;
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	/* Overlong forms, surrogates and code points past U+10FFFF are not UTF-8. */
	if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

void km_cli_json_escape(FILE *f, const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;

	fputc('"', f);
	for (size_t i = 0; i < len;) {
		unsigned char c = p[i];
		size_t n;
		switch (c) {
		case '"': fputs("\\\"", f); i++; continue;
		case '\\': fputs("\\\\", f); i++; continue;
		case '\n': fputs("\\n", f); i++; continue;
		case '\r': fputs("\\r", f); i++; continue;
		case '\t': fputs("\\t", f); i++; continue;
		case '\b': fputs("\\b", f); i++; continue;
		case '\f': fputs("\\f", f); i++; continue;
		default: break;
		}
		if (c < 0x20 || c == 0x7f) {
			fprintf(f, "\\u%04x", c);
			i++;
			continue;
		}
		n = utf8_len(p + i, len - i);
		if (n == 0) {
			fputs("\\ufffd", f); /* a stray byte: the document stays valid JSON */
			i++;
			continue;
		}
		fwrite(p + i, 1, n, f);
		i += n;
	}
	fputc('"', f);
}

void km_cli_json_strn(km_cli_json *j, const char *p, int32_t len)
{
	before_value(j);
	if (len < 0)
		fputs("null", j->f);
	else
		km_cli_json_escape(j->f, p, (size_t)len);
}

void km_cli_json_str(km_cli_json *j, const char *s)
{
	km_cli_json_strn(j, s, s ? (int32_t)strlen(s) : -1);
}

void km_cli_json_int(km_cli_json *j, int64_t v)
{
	before_value(j);
	fprintf(j->f, "%lld", (long long)v);
}

void km_cli_json_double(km_cli_json *j, double v)
{
	before_value(j);
	fprintf(j->f, "%.3f", v);
}

void km_cli_json_bool(km_cli_json *j, bool v)
{
	before_value(j);
	fputs(v ? "true" : "false", j->f);
}

void km_cli_json_null(km_cli_json *j)
{
	before_value(j);
	fputs("null", j->f);
}

void km_cli_json_uuid(km_cli_json *j, const km_uuid *u)
{
	char id[23];
	if (km_uuid_is_zero(u)) {
		km_cli_json_null(j);
		return;
	}
	km_uuid_str(u, id);
	km_cli_json_str(j, id);
}

/* ---- tables ---- */

bool km_cli_table_init(km_cli_table *t, size_t ncols, const char *const *headers)
{
	memset(t, 0, sizeof(*t));
	t->ncols = ncols;
	return km_cli_table_row(t, headers);
}

bool km_cli_table_row(km_cli_table *t, const char *const *cells)
{
	if (t->nrows == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		char **c = realloc(t->cells, cap * t->ncols * sizeof(char *));
		if (!c)
			return false;
		t->cells = c;
		t->cap = cap;
	}
	for (size_t i = 0; i < t->ncols; i++) {
		char *s = strdup(cells[i] ? cells[i] : "-");
		if (!s) {
			for (size_t k = 0; k < i; k++)
				free(t->cells[t->nrows * t->ncols + k]);
			return false;
		}
		/* A newline in a server's message would break the row apart. */
		for (char *q = s; *q; q++)
			if (*q == '\n' || *q == '\r' || *q == '\t')
				*q = ' ';
		t->cells[t->nrows * t->ncols + i] = s;
	}
	t->nrows++;
	return true;
}

void km_cli_table_print(const km_cli_table *t, FILE *f)
{
	size_t *w = calloc(t->ncols ? t->ncols : 1, sizeof(size_t));

	if (!w)
		return;
	for (size_t r = 0; r < t->nrows; r++)
		for (size_t c = 0; c < t->ncols; c++) {
			size_t n = strlen(t->cells[r * t->ncols + c]);
			if (n > w[c])
				w[c] = n;
		}
	for (size_t r = 0; r < t->nrows; r++) {
		for (size_t c = 0; c < t->ncols; c++) {
			const char *s = t->cells[r * t->ncols + c];
			if (c + 1 == t->ncols)
				fprintf(f, "%s\n", s);
			else
				fprintf(f, "%-*s  ", (int)w[c], s);
		}
	}
	free(w);
}

void km_cli_table_free(km_cli_table *t)
{
	for (size_t i = 0; i < t->nrows * t->ncols; i++)
		free(t->cells[i]);
	free(t->cells);
	memset(t, 0, sizeof(*t));
}

void km_cli_format_time(int64_t ms, char *buf, size_t len)
{
	time_t s;
	struct tm tm;

	if (ms < 0) {
		snprintf(buf, len, "-");
		return;
	}
	s = (time_t)(ms / 1000);
	if (!gmtime_r(&s, &tm) || !strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm))
		snprintf(buf, len, "%lld", (long long)ms);
}
