# The HAProxy pod's preStop: keep serving while the load balancer and kube-proxy stop sending
# new connections, then stop HAProxy gracefully (SIGUSR1 to its master: the ports close, the
# requests in flight are answered) and wait until it has exited.
sleep @DRAIN_SECONDS@
pid=$(cat @PID_FILE@ 2>/dev/null) || exit 0
kill -USR1 "$pid" 2>/dev/null || exit 0
while kill -0 "$pid" 2>/dev/null; do sleep 1; done
