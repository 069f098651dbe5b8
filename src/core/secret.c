/* Secrets every module meets: the mirror configuration keys that are secrets, reading a file that holds one, and the files a mirror may name. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kmirror/secret.h"

bool km_secret_config_key(const char *name)
{
	static const char *const secrets[] = {"sasl.jaas.config", "sasl.password", "ssl.key.password",
					      "ssl.keystore.password", "ssl.truststore.password",
					      "sasl.oauthbearer.client.credentials.client.secret"};
	size_t n;

	if (!name)
		return false;
	for (size_t i = 0; i < sizeof(secrets) / sizeof(secrets[0]); i++)
		if (!strcmp(name, secrets[i]))
			return true;
	n = strlen(name);
	return n >= 9 && !strcmp(name + n - 9, ".password");
}

/* Whether the mode lets anyone but the owner at the file; err says what to do about it. */
static bool mode_open(const char *option, const char *path, mode_t mode, bool mode_check, char *err, size_t errlen)
{
	if (!(mode & (S_IRWXG | S_IRWXO)))
		return false;
	if (mode_check)
		snprintf(err, errlen,
			 "%s %s can be read or changed by group or others (mode %04o): run chmod 600 %s (or set "
			 KM_SECRET_MODE_OPTION " = false to use it as it is)",
			 option, path, (unsigned)(mode & 07777), path);
	else
		snprintf(err, errlen,
			 "%s %s can be read or changed by group or others (mode %04o), used because "
			 KM_SECRET_MODE_OPTION " is false: run chmod 600 %s",
			 option, path, (unsigned)(mode & 07777), path);
	return true;
}

km_err km_secret_file_read(const char *option, const char *path, bool mode_check, uint8_t *buf, size_t cap,
			   size_t *len, bool *loose, char *err, size_t errlen)
{
	struct stat st;
	size_t n = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);

	*len = 0;
	*loose = false;
	if (fd < 0) {
		snprintf(err, errlen, "%s %s: %s", option, path, strerror(errno));
		return KM_ERR_CONFIG;
	}
	/* The mode of what was opened, not of a name that may have changed since. */
	if (fstat(fd, &st) != 0) {
		snprintf(err, errlen, "%s %s: %s", option, path, strerror(errno));
		close(fd);
		return KM_ERR_CONFIG;
	}
	*loose = mode_open(option, path, st.st_mode, mode_check, err, errlen);
	if (*loose && mode_check) {
		close(fd);
		return KM_ERR_CONFIG;
	}
	for (;;) {
		uint8_t one;
		ssize_t r = n < cap ? read(fd, buf + n, cap - n) : read(fd, &one, 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 || (n == cap && r > 0)) {
			if (r < 0)
				snprintf(err, errlen, "%s %s: %s", option, path, strerror(errno));
			else
				snprintf(err, errlen, "%s %s: larger than %zu bytes", option, path, cap);
			close(fd);
			explicit_bzero(buf, cap); /* not OPENSSL_cleanse: src/core does without OpenSSL */
			return KM_ERR_CONFIG;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	*len = n;
	return KM_OK;
}

bool km_mirror_file_allowed(const char *dir, const char *key, const char *path, char *err, size_t errlen)
{
	char rdir[PATH_MAX], rpath[PATH_MAX];
	size_t n;

	if (!dir || !*dir) {
		snprintf(err, errlen,
			 "%s names a file, and kmirrord reads mirrors' files only from mirror_file_dir, which is not set: "
			 "set it in kmirrord's configuration to the directory holding the mirrors' TLS files",
			 key);
		return false;
	}
	if (!realpath(dir, rdir)) {
		snprintf(err, errlen, "mirror_file_dir %s: %s", dir, strerror(errno));
		return false;
	}
	if (!path || path[0] != '/' || !realpath(path, rpath)) {
		snprintf(err, errlen, "%s must be an absolute path of an existing file in mirror_file_dir (%s)", key,
			 rdir);
		return false;
	}
	n = strlen(rdir);
	if (strncmp(rpath, rdir, n) != 0 || (rpath[n] != '/' && n != 1)) {
		snprintf(err, errlen, "%s is outside mirror_file_dir (%s): put the file there", key, rdir);
		return false;
	}
	return true;
}

const char *km_secret_url_file(const char *url)
{
	if (!url || strncmp(url, "file://", 7) != 0 || url[7] != '/' || !url[8])
		return NULL;
	return url + 7;
}
