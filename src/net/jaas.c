/* Kafka's sasl.jaas.config line: one login module, its flag, and key=value options up to the ';'. */
#include <ctype.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/sasl_int.h"

static const char *skip_ws(const char *p)
{
	while (*p && isspace((unsigned char)*p))
		p++;
	return p;
}

km_err km_sasl_fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return KM_ERR_CONFIG;
}

/* A value, quoted ("..." with backslash escapes) or bare (up to a space or ';'), copied; NULL on error. */
static char *jaas_value(const char **pp, char *err, size_t errlen)
{
	const char *p = *pp, *v = p;
	bool quoted = false;
	size_t cap, vl = 0;
	char *val;

	if (*p == '"') {
		quoted = true;
		v = ++p;
		while (*p && *p != '"')
			p += (*p == '\\' && p[1]) ? 2 : 1;
		if (*p != '"') {
			km_sasl_fail(err, errlen, "sasl.jaas.config: unterminated quoted value");
			return NULL;
		}
		cap = (size_t)(p - v);
		p++;
	} else {
		while (*p && !isspace((unsigned char)*p) && *p != ';')
			p++;
		cap = (size_t)(p - v);
	}
	if (!(val = malloc(cap + 1))) {
		km_sasl_fail(err, errlen, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < cap; i++) {
		if (quoted && v[i] == '\\' && i + 1 < cap)
			i++;
		val[vl++] = v[i];
	}
	val[vl] = 0;
	*pp = p;
	return val;
}

void km_sasl_jaas_free(char **vals, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (vals[i]) {
			/* A value may be a secret (a client secret, a password). */
			memset(vals[i], 0, strlen(vals[i]));
			free(vals[i]);
		}
		vals[i] = NULL;
	}
}

km_err km_sasl_jaas_options(const char *jaas, const char *module, const char *mechanism, const char *const *keys,
			    char **vals, size_t n, char *err, size_t errlen)
{
	const char *p = skip_ws(jaas), *start, *dot = strrchr(module, '.');
	const char *shortname = dot ? dot + 1 : module; /* the package may be left out */
	size_t ml = strlen(shortname), len;

	for (size_t i = 0; i < n; i++)
		vals[i] = NULL;
	start = p;
	while (*p && !isspace((unsigned char)*p) && *p != ';')
		p++;
	len = (size_t)(p - start);
	if (len < ml || strncmp(p - ml, shortname, ml) != 0 || (len > ml && p[-(ptrdiff_t)ml - 1] != '.'))
		return km_sasl_fail(err, errlen, "sasl.jaas.config: %s takes %s, not '%.*s'", mechanism, module,
			    (int)(len > 100 ? 100 : len), start);
	p = skip_ws(p);
	start = p;
	while (*p && isalpha((unsigned char)*p))
		p++;
	len = (size_t)(p - start);
	if (!((len == 8 && !strncmp(start, "required", 8)) || (len == 9 && !strncmp(start, "requisite", 9)) ||
	      (len == 10 && !strncmp(start, "sufficient", 10)) || (len == 8 && !strncmp(start, "optional", 8))))
		return km_sasl_fail(err, errlen, "sasl.jaas.config: expected 'required' after the login module");
	for (;;) {
		char key[64], *val;
		size_t kl = 0;
		bool kept = false;

		p = skip_ws(p);
		if (*p == ';' || !*p)
			break;
		while (*p && (isalnum((unsigned char)*p) || *p == '_' || *p == '.' || *p == '-') && kl + 1 < sizeof(key))
			key[kl++] = *p++;
		key[kl] = 0;
		p = skip_ws(p);
		if (!kl || *p != '=') {
			km_sasl_fail(err, errlen, "sasl.jaas.config: expected key=\"value\" near '%.20s'", p);
			goto bad;
		}
		p = skip_ws(p + 1);
		if (!(val = jaas_value(&p, err, errlen)))
			goto bad;
		for (size_t i = 0; i < n && !kept; i++) {
			if (!strcmp(key, keys[i])) {
				km_sasl_jaas_free(&vals[i], 1);
				vals[i] = val;
				kept = true;
			}
		}
		if (!kept)
			km_sasl_jaas_free(&val, 1); /* the Java login's own options (debug, ...) */
	}
	if (*p != ';') {
		km_sasl_fail(err, errlen, "sasl.jaas.config: missing ';' at the end");
		goto bad;
	}
	return KM_OK;
bad:
	km_sasl_jaas_free(vals, n);
	return KM_ERR_CONFIG;
}
