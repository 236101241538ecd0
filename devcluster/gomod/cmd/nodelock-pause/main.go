// Command nodelock-pause is the pod sandbox ("pause") container of devcluster's containerd
// nodes: it holds the pod's namespaces open, reaps the children that a shared PID namespace
// leaves to it, and exits 0 on SIGTERM or SIGINT, as Kubernetes' own pause
// (build/pause/linux/pause.c) does. No registry is reachable here, so devcluster builds it
// and imports it into each node's containerd as the CRI plugin's sandbox image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getpid() != 1 {
		os.Stderr.WriteString("warning: nodelock-pause should be the first process\n")
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
