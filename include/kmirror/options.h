/* kmirror option engine: a table of typed options over any struct (defaults, parsing, files, reload rules, docs). */
#ifndef KMIRROR_OPTIONS_H
#define KMIRROR_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kmirror/error.h"

typedef struct km_hostport {
	char host[256];
	uint16_t port;
} km_hostport;

/* What a row's field is, at its offset. */
typedef enum {
	KM_OPT_STRING,        /* char *, owned, NULL when empty */
	KM_OPT_INT,           /* int64_t, within [min, max] */
	KM_OPT_BOOL,          /* bool: true/false, yes/no, on/off, 1/0 */
	KM_OPT_HOSTPORT,      /* km_hostport, a listener's; empty text: all zero; ":PORT": 0.0.0.0:PORT */
	KM_OPT_HOSTPORT_LIST, /* km_hostport[max], with an int count at count_offset */
	KM_OPT_ENUM,          /* int64_t index into choices->names */
} km_opt_type;

/* A name table: the values of a KM_OPT_ENUM, or the allowed values of a KM_OPT_STRING. */
typedef struct km_opt_enum {
	const char *type_name; /* shown in the doc table ("log level"); NULL: "enum" (or "string") */
	const char *const *names;
	size_t count;
	bool match_case; /* names compared case-sensitively (SASL mechanisms); otherwise not */
} km_opt_enum;

typedef struct km_option {
	const char *name;  /* key in a file, and --name-with-dashes on a command line */
	km_opt_type type;
	size_t offset;       /* of the field in the table's struct */
	size_t count_offset; /* KM_OPT_HOSTPORT_LIST: of its int count */
	const char *def;     /* default, as it would be written in a file ("" = empty) */
	int64_t min, max;    /* KM_OPT_INT bounds; KM_OPT_HOSTPORT_LIST: max is the array's capacity */
	const km_opt_enum *choices; /* KM_OPT_ENUM: its names; KM_OPT_STRING: allowed values besides empty */
	bool reloadable;     /* may change on reload; the others need a restart */
	bool secret;         /* formatted as ******** when set */
	const char *doc;
} km_option;

/* One table: its rows in documentation order, over a struct of size bytes. */
typedef struct km_opt_table {
	const km_option *rows;
	size_t count;
	size_t size;
} km_opt_table;

#define KM_OPT_SECRET_MASK "********"

const km_option *km_opt_find(const km_opt_table *t, const char *name);
/* "string", "integer", "boolean", "host:port", "host:port list", or the enum's type name. */
const char *km_opt_type_name(const km_option *o);

/* Zero obj and set every default. Fails only on a bad default (a bug in the table) or no memory. */
km_err km_opt_init(const km_opt_table *t, void *obj);
/* Free the strings of obj (the struct itself is the caller's). */
void km_opt_free(const km_opt_table *t, void *obj);
/* Deep copy; dst is overwritten, not freed. */
km_err km_opt_copy(const km_opt_table *t, void *dst, const void *src) __attribute__((warn_unused_result));

/* Set one row from text; on failure obj is unchanged and err (size errlen) says why. */
km_err km_opt_set_row(const km_option *o, void *obj, const char *value, char *err, size_t errlen)
	__attribute__((warn_unused_result));
km_err km_opt_set(const km_opt_table *t, void *obj, const char *name, const char *value, char *err,
		  size_t errlen) __attribute__((warn_unused_result));
/*
 * Read "key = value" lines (# comments, blank lines, "quoted" values) on top of obj. The first bad
 * line fails the whole file ("path:line: why") and leaves obj unchanged.
 */
km_err km_opt_load_file(const km_opt_table *t, void *obj, const char *path, char *err, size_t errlen)
	__attribute__((warn_unused_result));

/* The value of o in obj as file text; secrets that are set come out as KM_OPT_SECRET_MASK. */
void km_opt_format(const km_option *o, const void *obj, char *buf, size_t len);
bool km_opt_equal(const km_option *o, const void *a, const void *b);
/* Whether next may replace cur: fails naming the first non-reloadable option that differs. */
km_err km_opt_check_reload(const km_opt_table *t, const void *cur, const void *next, char *err, size_t errlen)
	__attribute__((warn_unused_result));

/* Every option as "name = value" lines (secrets masked): a config file that loads back. */
void km_opt_write_values(const km_opt_table *t, const void *obj, FILE *out);
/* The Markdown table of the options (option, type, default, reloadable, description). */
void km_opt_write_doc(const km_opt_table *t, FILE *out);

/*
 * "host:port" or "[v6]:port": a host of letters, digits and . - _ : % (no bracket inside; an
 * unbracketed host's last colon is the port's), a port of 1-5 digits up to 65535. What it accepts
 * km_hostport_format prints so that it parses back to the same value.
 */
bool km_hostport_parse(const char *s, km_hostport *hp);
/* What km_hostport_parse accepts, for error messages. */
#define KM_HOSTPORT_SYNTAX "HOST:PORT or [IPV6]:PORT, a host of letters, digits and . - _ : % only"
/* The inverse; an all-zero km_hostport is "". */
void km_hostport_format(const km_hostport *hp, char *buf, size_t len);

#endif
