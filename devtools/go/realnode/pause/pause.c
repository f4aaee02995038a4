/* The pod sandbox's process: holds the pod's namespaces, reaps the zombies of processes that
 * share its PID namespace, and exits on SIGTERM or SIGINT. What registry.k8s.io/pause does,
 * built here because no registry is reachable. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signum) { _exit(signum == SIGTERM ? 0 : 2); }

static void reap(int signum) {
    (void)signum;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &on_stop, NULL);
    sigaction(SIGTERM, &on_stop, NULL);
    sigaction(SIGCHLD, &on_child, NULL);
    for (;;) {
        pause();
    }
}
