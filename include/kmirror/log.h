/* kmirror logging: one line per event, key=value pairs, to stderr. */
#ifndef KMIRROR_LOG_H
#define KMIRROR_LOG_H

#include <stdbool.h>
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
