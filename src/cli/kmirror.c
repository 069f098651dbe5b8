/* kmirror: the admin CLI for mirrors (speaks the mirror RPCs to kmirrord). */
#include <signal.h>
#include <stdio.h>

#include "cli/cli.h"
#include "kmirror/log.h"
#include "kmirror/version.h"

int main(int argc, char **argv)
{
	km_cli_args a;
	char err[1024];
	int rc;

	/* The client's own log lines (connection warnings) would muddle the one-line reason. */
	km_log_set_level(KM_LOG_ERROR);
	signal(SIGPIPE, SIG_IGN);
	rc = km_cli_parse(argc, argv, &a, err, sizeof(err));
	if (a.version) {
		printf("kmirror %s\n", KM_VERSION);
		km_cli_args_free(&a);
		return KM_CLI_EXIT_OK;
	}
	if (a.help) {
		km_cli_usage(stdout, a.cmd);
		km_cli_args_free(&a);
		return KM_CLI_EXIT_OK;
	}
	if (rc != KM_CLI_EXIT_OK) {
		fprintf(stderr, "kmirror: %s\n", err);
		km_cli_args_free(&a);
		return rc;
	}
	if (a.inline_secret[0])
		fprintf(stderr,
			"kmirror: warning: --config %s=... puts a secret on the command line, where every user of this "
			"host can read it (ps, /proc) and the shell history keeps it: give it in a properties file "
			"with --config-file\n",
			a.inline_secret);
	rc = km_cli_run(&a, stdout, stderr);
	km_cli_args_free(&a);
	return rc;
}
