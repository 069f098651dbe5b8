/* Secrets as every module meets them: which mirror configuration keys are secrets, and files that hold one. */
#ifndef KMIRROR_SECRET_H
#define KMIRROR_SECRET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmirror/error.h"

/*
 * Whether a mirror configuration key holds a secret: sasl.password, sasl.jaas.config,
 * ssl.key.password, ssl.keystore.password, ssl.truststore.password, and any key ending in
 * ".password". kmirrord stores those sealed; the kmirror CLI warns when one is on its command line.
 */
bool km_secret_config_key(const char *name);

/*
 * Read a file holding a secret (at most cap bytes; a larger one is refused) into buf, *len bytes.
 * A file that group or others may read or write (mode & 077) is refused when mode_check is true,
 * with what to run in err; when it is false the file is read, *loose is set and err holds the
 * warning to log. option names the setting in messages ("mirror_secret_key_file /etc/k: ...").
 * Nothing of the file is left in memory but buf.
 */
km_err km_secret_file_read(const char *option, const char *path, bool mode_check, uint8_t *buf, size_t cap,
			   size_t *len, bool *loose, char *err, size_t errlen) __attribute__((warn_unused_result));

/*
 * Whether the file a mirror configuration names (ssl.*.location) may be read: with its symlinks
 * and ".." resolved it is inside dir (mirror_file_dir). false with err saying why and what to do
 * (dir NULL or empty: no file may be named). Whoever may create or alter a mirror chooses these
 * paths, and kmirrord reads them with its own rights.
 */
bool km_mirror_file_allowed(const char *dir, const char *key, const char *path, char *err, size_t errlen);

/*
 * The file a file:// URL names (a pointer into url, an absolute path: file:///PATH); NULL for
 * another scheme or a malformed URL. A token endpoint given as a file holds a bearer token.
 */
const char *km_secret_url_file(const char *url);

/* The option that turns the mode check off, as messages name it. */
#define KM_SECRET_MODE_OPTION "secret_file_mode_check"

#endif
