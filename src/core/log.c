/* Logging: timestamped key=value lines on stderr, filtered by a global level. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

#include "kmirror/log.h"

km_log_level km_log_current = KM_LOG_INFO;

const char *const km_log_level_names[KM_LOG_TRACE + 1] = {"error", "warn", "info", "debug", "trace"};

void km_log_set_level(km_log_level level)
{
	km_log_current = level;
}

bool km_log_level_parse(const char *name, km_log_level *out)
{
	for (size_t i = 0; i < sizeof(km_log_level_names) / sizeof(km_log_level_names[0]); i++) {
		if (strcasecmp(name, km_log_level_names[i]) == 0) {
			*out = (km_log_level)i;
			return true;
		}
	}
	return false;
}

const char *km_log_level_name(km_log_level level)
{
	if ((unsigned)level < sizeof(km_log_level_names) / sizeof(km_log_level_names[0]))
		return km_log_level_names[level];
	return "unknown";
}

/* The escape of byte c into e (1 to 4 bytes, not terminated): its length. */
static size_t escape_one(unsigned char c, char e[4])
{
	static const char hex[] = "0123456789abcdef";
	const char *two = c == '\\' ? "\\\\" : c == '"' ? "\\\"" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
			: c == '\t' ? "\\t" : NULL;

	if (two) {
		memcpy(e, two, 2);
		return 2;
	}
	if (c < 0x20 || c >= 0x7f) {
		e[0] = '\\';
		e[1] = 'x';
		e[2] = hex[c >> 4];
		e[3] = hex[c & 15];
		return 4;
	}
	e[0] = (char)c;
	return 1;
}

const char *km_log_escape(char *buf, size_t cap, const char *s, int32_t len)
{
	size_t n = 0, need = 0, room;
	char e[4];

	if (!cap)
		return buf;
	buf[0] = '\0';
	if (!s || len <= 0)
		return buf;
	for (int32_t i = 0; i < len; i++)
		need += escape_one((unsigned char)s[i], e);
	/* All of it, or as much as leaves room for the cut mark. */
	room = need < cap ? cap - 1 : cap > 4 ? cap - 4 : 0;
	for (int32_t i = 0; i < len; i++) {
		size_t k = escape_one((unsigned char)s[i], e);
		if (n + k > room)
			break;
		memcpy(buf + n, e, k);
		n += k;
	}
	if (need >= cap && cap >= 4) {
		memcpy(buf + n, "...", 3);
		n += 3;
	}
	buf[n] = '\0';
	return buf;
}

void km_log_write(km_log_level level, const char *component, uint64_t conn, const char *fmt, ...)
{
	char line[2048];
	struct timeval tv;
	struct tm tm;
	size_t n;
	va_list ap;

	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03dZ level=%s comp=%s", (int)(tv.tv_usec / 1000),
			      km_log_level_name(level), component);
	if (conn)
		n += (size_t)snprintf(line + n, sizeof(line) - n, " conn=%llu", (unsigned long long)conn);
	n += (size_t)snprintf(line + n, sizeof(line) - n, " msg=\"");
	va_start(ap, fmt);
	if (n < sizeof(line))
		n += (size_t)vsnprintf(line + n, sizeof(line) - n, fmt, ap);
	va_end(ap);
	if (n > sizeof(line) - 3)
		n = sizeof(line) - 3;
	line[n++] = '"';
	line[n++] = '\n';
	line[n] = '\0';
	fputs(line, stderr);
}
