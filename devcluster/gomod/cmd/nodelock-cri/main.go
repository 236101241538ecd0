// Command nodelock-cri is a CRI runtime and image service for one real kubelet that fakes only
// container execution.
//
// It serves k8s.io/cri-api's runtime v1 RuntimeService and ImageService on a unix socket, built on
// Kubernetes' in-memory fake runtime (k8s.io/cri-client/pkg/fake). What it adds:
//
//   - every container config kubelet hands it in CreateContainer (environment, device nodes,
//     mounts, CDI devices, annotations) is appended as one JSON line to --record, before the
//     call returns, so the file is the ground truth of what kubelet would have started;
//   - any image is present: ImageStatus answers for every image, so kubelet never pulls;
//   - containers run as asked: an init container (one the pod lists in initContainers without
//     restartPolicy Always) exits 0 as soon as it starts; an app container runs until stopped, or
//     exits 0 after the pod's sim.nodelock.io/run-seconds (the pod annotation the simulated
//     kubelet reads too) when that is set.
//
// The pod's spec is read once from the API server (--kubeconfig) to know its init containers.
// No process, image, cgroup or network is created. State is in memory: a restarted runtime knows
// no container, as a container runtime that lost its state would.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

type config struct {
	listen     string
	record     string
	kubeconfig string
	verbosity  int
}

// maxSocketPath is the longest unix socket path (sun_path holds 108 bytes with the NUL).
const maxSocketPath = 107

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg, err := parseFlags(args, os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "nodelock-cri: %v\n", err)
		return 2
	}
	if err := setupLogging(cfg.verbosity); err != nil {
		fmt.Fprintf(os.Stderr, "nodelock-cri: %v\n", err)
		return 2
	}
	defer klog.Flush()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		klog.ErrorS(err, "Cannot load kubeconfig", "path", cfg.kubeconfig)
		return 1
	}
	restCfg.UserAgent = "nodelock-cri"
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		klog.ErrorS(err, "Cannot build the API client")
		return 1
	}
	recorder, err := openRecorder(cfg.record)
	if err != nil {
		klog.ErrorS(err, "Cannot open the record file", "path", cfg.record)
		return 1
	}
	defer recorder.close()

	rt := newRuntime(recorder, apiPods{client: client})
	if err := os.Remove(cfg.listen); err != nil && !errors.Is(err, os.ErrNotExist) {
		klog.ErrorS(err, "Cannot remove a stale socket", "path", cfg.listen)
		return 1
	}
	lis, err := net.Listen("unix", cfg.listen)
	if err != nil {
		klog.ErrorS(err, "Cannot listen", "path", cfg.listen)
		return 1
	}
	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, rt)
	kubeapi.RegisterImageServiceServer(server, rt)
	go func() {
		<-ctx.Done()
		server.Stop()
	}()
	klog.InfoS("Serving the CRI runtime and image services", "socket", cfg.listen, "record", cfg.record)
	if err := server.Serve(lis); err != nil && ctx.Err() == nil {
		klog.ErrorS(err, "Stopped with error")
		return 1
	}
	_ = os.Remove(cfg.listen)
	klog.InfoS("Stopped")
	return 0
}

func parseFlags(args []string, out io.Writer) (config, error) {
	fs := flag.NewFlagSet("nodelock-cri", flag.ContinueOnError)
	fs.SetOutput(out)
	var cfg config
	var logLevel string
	fs.StringVar(&cfg.listen, "listen", "", "unix socket to serve the CRI on (kubelet's --container-runtime-endpoint, required)")
	fs.StringVar(&cfg.record, "record", "", "file each container config kubelet creates is appended to, one JSON object a line (required)")
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "kubeconfig of the API server, to read pods' init containers (required)")
	fs.StringVar(&logLevel, "log-level", "info", "info, debug (klog -v=2), trace (-v=5) or a klog verbosity number")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: nodelock-cri --listen SOCKET --record FILE --kubeconfig PATH\n\n"+
			"A CRI runtime for one kubelet that fakes only container execution and records every\n"+
			"container config it is handed (see docs/simkubelet.md).\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	for flagName, v := range map[string]string{"listen": cfg.listen, "record": cfg.record, "kubeconfig": cfg.kubeconfig} {
		if v == "" {
			return cfg, fmt.Errorf("--%s is required", flagName)
		}
	}
	if n := len(cfg.listen); n > maxSocketPath {
		return cfg, fmt.Errorf("--listen is %d bytes long; a unix socket path holds at most %d", n, maxSocketPath)
	}
	var err error
	if cfg.verbosity, err = parseLogLevel(logLevel); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func parseLogLevel(s string) (int, error) {
	switch strings.ToLower(s) {
	case "info", "":
		return 0, nil
	case "debug":
		return 2, nil
	case "trace":
		return 5, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--log-level %q: want info, debug, trace or a number >= 0", s)
	}
	return n, nil
}

func setupLogging(verbosity int) error {
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	for name, value := range map[string]string{"v": strconv.Itoa(verbosity), "logtostderr": "true"} {
		if err := kfs.Set(name, value); err != nil {
			return fmt.Errorf("klog flag %s: %w", name, err)
		}
	}
	return nil
}
