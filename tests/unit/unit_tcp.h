/* Unit test helper: a connected loopback TCP pair, both ends non-blocking. */
#ifndef KMIRROR_UNIT_TCP_H
#define KMIRROR_UNIT_TCP_H

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* fds[0] the connecting side, fds[1] the accepted one. */
static void tcp_pair(int fds[2])
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	int l = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(l >= 0);
	assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(l, 1), 0);
	assert_int_equal(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
	fds[0] = socket(AF_INET, SOCK_STREAM, 0);
	assert_int_equal(connect(fds[0], (struct sockaddr *)&sa, sizeof(sa)), 0);
	fds[1] = accept(l, NULL, NULL);
	assert_true(fds[1] >= 0);
	close(l);
	for (int i = 0; i < 2; i++)
		assert_int_equal(fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK), 0);
}

#endif
