/* kmirror logging: one line per event, key=value pairs, to stderr. */
#ifndef KMIRROR_LOG_H
#define KMIRROR_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
	KM_LOG_ERROR = 0,
	KM_LOG_WARN,
	KM_LOG_INFO,
	KM_LOG_DEBUG,
	KM_LOG_TRACE,
} km_log_level;

extern km_log_level km_log_current;
/* The level names, indexed by km_log_level. */
extern const char *const km_log_level_names[KM_LOG_TRACE + 1];

void km_log_set_level(km_log_level level);
/* "error", "warn", "info", "debug", "trace"; returns false for anything else. */
bool km_log_level_parse(const char *name, km_log_level *out);
const char *km_log_level_name(km_log_level level);

/* component: "proxy", "net", ...; conn: connection id, 0 when none. */
void km_log_write(km_log_level level, const char *component, uint64_t conn, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/*
 * Text a peer chose (a client id, a topic name from a request, a config value) made fit for one
 * log line: s (len bytes; len < 0 or s NULL: nothing) into buf (cap bytes, at least 4; always
 * terminated), with backslashes, double quotes, control bytes and bytes from 0x7f as escapes (\\,
 * \", \n, \r, \t, \xHH), so that it can neither end the line, forge a field, nor drive a
 * terminal. Cut with "..." when the escaped text does not fit. Returns buf, for a "%s" argument.
 */
const char *km_log_escape(char *buf, size_t cap, const char *s, int32_t len);
/* A buffer for km_log_escape that holds n bytes of text escaped (4 each at most) and the cut mark. */
#define KM_LOG_ESCAPED_SIZE(n) (4 * (size_t)(n) + 4)

#define KM_LOG(level, comp, conn, ...) \
	do { \
		if ((level) <= km_log_current) \
			km_log_write((level), (comp), (conn), __VA_ARGS__); \
	} while (0)
#define KM_ERROR(comp, conn, ...) KM_LOG(KM_LOG_ERROR, comp, conn, __VA_ARGS__)
#define KM_WARN(comp, conn, ...)  KM_LOG(KM_LOG_WARN, comp, conn, __VA_ARGS__)
#define KM_INFO(comp, conn, ...)  KM_LOG(KM_LOG_INFO, comp, conn, __VA_ARGS__)
#define KM_DEBUG(comp, conn, ...) KM_LOG(KM_LOG_DEBUG, comp, conn, __VA_ARGS__)
#define KM_TRACE(comp, conn, ...) KM_LOG(KM_LOG_TRACE, comp, conn, __VA_ARGS__)

#endif
