/* GSSAPI's start on a thread of its own: the calls that may wait for a KDC stay off the event loop (docs/security.md, "Kerberos"). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/crypto.h>

#include "kmirror/net.h"

struct km_sasl_job {
	/* asked: copies, read by the thread */
	char *host, *service_name, *keytab, *principal, *setting;
	/* made by the thread, read on the loop once it said so */
	km_sasl *s;
	km_wr first;
	char why[400];
	/* the loop's side */
	struct event_base *base;
	struct event *ev;
	int fds[2];
	pthread_t thread;
	km_sasl_job_done done;
	void *arg;
	bool cancelled;
};

static void job_free(km_sasl_job *j)
{
	if (j->ev)
		event_free(j->ev);
	for (int i = 0; i < 2; i++)
		if (j->fds[i] >= 0)
			close(j->fds[i]);
	km_sasl_free(j->s);
	if (j->first.buf)
		OPENSSL_cleanse(j->first.buf, j->first.cap);
	km_wr_free(&j->first);
	free(j->host);
	free(j->service_name);
	free(j->keytab);
	free(j->principal);
	free(j->setting);
	free(j);
}

/* The thread: the credentials from the keytab, then the first token (the KDC's tickets); then it says so. */
static void *job_run(void *arg)
{
	km_sasl_job *j = arg;
	km_sasl_krb5 k = {j->service_name, j->keytab, j->principal, j->setting};
	bool done = false;
	ssize_t n;

	if ((j->s = km_sasl_new_gssapi(j->host, &k, j->why, sizeof(j->why)))) {
		if (km_sasl_step(j->s, NULL, 0, &j->first, &done) != KM_OK || done) {
			snprintf(j->why, sizeof(j->why), "%s",
				 *km_sasl_reason(j->s) ? km_sasl_reason(j->s) : "no first token");
			km_sasl_free(j->s);
			j->s = NULL;
		}
	}
	do
		n = write(j->fds[1], "", 1);
	while (n < 0 && errno == EINTR);
	return NULL;
}

/* On the loop: the thread is over; its result goes to the caller, or is freed after a cancel. */
static void job_over(evutil_socket_t fd, short what, void *arg)
{
	km_sasl_job *j = arg;
	km_sasl *s;
	(void)fd;
	(void)what;

	pthread_join(j->thread, NULL);
	if (!j->cancelled) {
		s = j->s;
		j->s = NULL; /* the caller's now */
		j->done(j->arg, s, j->first.buf, j->first.len, s ? NULL : j->why);
	}
	job_free(j);
}

static char *dup_or_null(const char *v)
{
	return v ? strdup(v) : NULL;
}

km_sasl_job *km_sasl_gssapi_start(struct event_base *base, const char *host, const km_sasl_krb5 *k,
				  km_sasl_job_done done, void *arg, char *why, size_t whylen)
{
	km_sasl_job *j = calloc(1, sizeof(*j));
	int rc;

	if (!j) {
		snprintf(why, whylen, "out of memory");
		return NULL;
	}
	j->fds[0] = j->fds[1] = -1;
	km_wr_init(&j->first);
	j->base = base;
	j->done = done;
	j->arg = arg;
	j->host = strdup(host);
	j->service_name = dup_or_null(k->service_name);
	j->keytab = dup_or_null(k->keytab);
	j->principal = dup_or_null(k->principal);
	j->setting = dup_or_null(k->setting);
	if (!j->host || (k->service_name && !j->service_name) || (k->keytab && !j->keytab) ||
	    (k->principal && !j->principal) || (k->setting && !j->setting)) {
		snprintf(why, whylen, "out of memory");
		job_free(j);
		return NULL;
	}
	if (pipe(j->fds) != 0 || fcntl(j->fds[0], F_SETFD, FD_CLOEXEC) != 0 ||
	    fcntl(j->fds[1], F_SETFD, FD_CLOEXEC) != 0 ||
	    !(j->ev = event_new(base, j->fds[0], EV_READ, job_over, j)) || event_add(j->ev, NULL) != 0) {
		snprintf(why, whylen, "cannot wait for a Kerberos login: %s", strerror(errno));
		job_free(j);
		return NULL;
	}
	if ((rc = pthread_create(&j->thread, NULL, job_run, j)) != 0) {
		snprintf(why, whylen, "cannot start a thread for a Kerberos login: %s", strerror(rc));
		job_free(j);
		return NULL;
	}
	return j;
}

void km_sasl_job_cancel(km_sasl_job *j)
{
	if (j)
		j->cancelled = true; /* job_over frees it once the thread is over */
}
