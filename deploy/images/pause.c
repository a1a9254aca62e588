/* The pod sandbox ("pause") process: holds the pod's namespaces open, reaps zombies (it is PID 1 when the pod shares
 * its process namespace) and exits cleanly on SIGINT/SIGTERM. Built static by deploy/images/build.sh. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { _exit(sig == SIGTERM || sig == SIGINT ? 0 : 1); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  if (getpid() != 1) fprintf(stderr, "pause: not PID 1; reaping only this process's children\n");
  struct sigaction sa = {0};
  sa.sa_handler = stop;
  if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0) return 1;
  sa.sa_handler = reap;
  sa.sa_flags = SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &sa, NULL) < 0) return 1;
  for (;;) pause();
}
