// Command nodelock-simkubelet is a simulated kubelet for one node whose device side is kubelet's
// own, unmodified device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager).
//
// The device plugin registration server on /var/lib/kubelet/device-plugins/kubelet.sock, the
// plugin endpoints, the checkpoint, Allocate, GetCapacity and GetDeviceRunContainerOptions are
// kubelet's code; pod admission goes through kubelet's topology manager (policy and NUMA node
// count from --topology-manager-policy and --numa-nodes), the same path kubelet uses. Only container start is simulated. See docs/simkubelet.md.
//
// The registration socket path is fixed, so run one instance per private mount namespace with the
// node's plugin directory bind-mounted on /var/lib/kubelet/device-plugins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// config is the parsed command line.
type config struct {
	kubeconfig     string
	nodeName       string
	resourceName   string
	labels         map[string]string
	heartbeat      time.Duration
	statusReport   time.Duration
	startDelay     time.Duration
	verbosity      int
	qps            float64
	burst          int
	leaseDurationS int
	// kubelet's topology manager: policy (none, best-effort, restricted, single-numa-node) and
	// the machine's NUMA nodes 0..numaNodes-1 (cadvisor's topology on a real node).
	topologyPolicy string
	numaNodes      int
	// podResourcesSocket is where kubelet's PodResources API is served ("" = not served).
	podResourcesSocket string
	// podResourcesList is which pods List returns: listActive (kubelet 1.34+ by default) or
	// listAll (kubelet before 1.34, or 1.34+ with KubeletPodResourcesListUseActivePods=false).
	podResourcesList string
}

// The values of --pod-resources-list.
const (
	listActive = "active"
	listAll    = "all"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg, err := parseFlags(args, os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "nodelock-simkubelet: %v\n", err)
		return 2
	}
	if err := setupLogging(cfg.verbosity); err != nil {
		fmt.Fprintf(os.Stderr, "nodelock-simkubelet: %v\n", err)
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
	restCfg.QPS = float32(cfg.qps)
	restCfg.Burst = cfg.burst
	restCfg.UserAgent = "nodelock-simkubelet/" + cfg.nodeName

	if err := setListGate(cfg.podResourcesList); err != nil {
		klog.ErrorS(err, "Cannot start")
		return 1
	}
	sk, err := newSimKubelet(ctx, cfg, restCfg)
	if err != nil {
		klog.ErrorS(err, "Cannot start")
		return 1
	}
	if err := sk.run(ctx); err != nil && ctx.Err() == nil {
		klog.ErrorS(err, "Stopped with error")
		return 1
	}
	klog.InfoS("Stopped", "node", cfg.nodeName)
	return 0
}

// parseFlags parses the command line; it reports usage errors as errors.
func parseFlags(args []string, out io.Writer) (config, error) {
	fs := flag.NewFlagSet("nodelock-simkubelet", flag.ContinueOnError)
	fs.SetOutput(out)
	var cfg config
	var labels, logLevel string
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "kubeconfig of the API server (required)")
	fs.StringVar(&cfg.nodeName, "node-name", "", "name of the Node object this harness runs (required)")
	fs.StringVar(&cfg.resourceName, "resource-name", "nvidia.com/gpu", "device plugin resource whose device IDs are recorded as deviceIDs in "+allocatedAnnotation)
	fs.StringVar(&labels, "labels", "", "extra node labels, k=v,k=v")
	fs.DurationVar(&cfg.heartbeat, "heartbeat", 10*time.Second, "node Lease renew interval (kubelet's default is 10s)")
	fs.DurationVar(&cfg.statusReport, "status-report-interval", time.Minute, "node status is patched when it changes and at least this often (refreshes the Ready heartbeat)")
	fs.DurationVar(&cfg.startDelay, "start-delay", 0, "simulated container start time between admission and Running")
	fs.StringVar(&logLevel, "log-level", "info", "info, debug (klog -v=2, includes the device manager's detail) or trace (-v=5), or a klog verbosity number")
	fs.Float64Var(&cfg.qps, "kube-api-qps", 50, "client QPS to the API server")
	fs.IntVar(&cfg.burst, "kube-api-burst", 100, "client burst to the API server")
	fs.StringVar(&cfg.topologyPolicy, "topology-manager-policy", "none", "kubelet's topology manager policy: none, best-effort, restricted or single-numa-node")
	fs.StringVar(&cfg.podResourcesSocket, "pod-resources-socket", "", "serve kubelet's PodResources API (v1, v1alpha1) on this unix socket, as kubelet does on /var/lib/kubelet/pod-resources/kubelet.sock (empty: not served)")
	fs.StringVar(&cfg.podResourcesList, "pod-resources-list", listActive, "which pods PodResources List returns: active (kubelet 1.34+ with its default feature gate KubeletPodResourcesListUseActivePods) or all (every pod in the pod manager, rejected and finished ones included, as kubelet before 1.34 or with that gate off)")
	fs.IntVar(&cfg.numaNodes, "numa-nodes", 0, "NUMA nodes of the simulated machine (0: no NUMA information; a policy other than none needs at least 1)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: nodelock-simkubelet --kubeconfig PATH --node-name NAME [flags]\n\n"+
			"A simulated kubelet for one node; its device side is kubelet's own device manager, serving\n"+
			"%s. Run it in a private mount namespace with the node's plugin directory\n"+
			"bind-mounted there (see docs/simkubelet.md).\n\nflags:\n", devicePluginSocket)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if cfg.kubeconfig == "" {
		return cfg, errors.New("--kubeconfig is required")
	}
	if cfg.nodeName == "" {
		return cfg, errors.New("--node-name is required")
	}
	if errs := validation.IsDNS1123Subdomain(cfg.nodeName); len(errs) > 0 {
		return cfg, fmt.Errorf("--node-name %q: %s", cfg.nodeName, strings.Join(errs, "; "))
	}
	if errs := validation.IsQualifiedName(cfg.resourceName); len(errs) > 0 || !strings.Contains(cfg.resourceName, "/") {
		return cfg, fmt.Errorf("--resource-name %q is not an extended resource name (domain/name)", cfg.resourceName)
	}
	if cfg.heartbeat <= 0 {
		return cfg, errors.New("--heartbeat must be positive")
	}
	if cfg.statusReport <= 0 {
		return cfg, errors.New("--status-report-interval must be positive")
	}
	if cfg.startDelay < 0 {
		return cfg, errors.New("--start-delay must not be negative")
	}
	switch cfg.topologyPolicy {
	case "none", "best-effort", "restricted", "single-numa-node":
	default:
		return cfg, fmt.Errorf("--topology-manager-policy %q: want none, best-effort, restricted or single-numa-node", cfg.topologyPolicy)
	}
	if cfg.numaNodes < 0 || cfg.numaNodes > 8 {
		return cfg, errors.New("--numa-nodes must be between 0 and 8 (kubelet's topology manager handles at most 8)")
	}
	if n := len(cfg.podResourcesSocket); n > maxSocketPath {
		return cfg, fmt.Errorf("--pod-resources-socket is %d bytes long; a unix socket path holds at most %d", n, maxSocketPath)
	}
	switch cfg.podResourcesList {
	case listActive, listAll:
	default:
		return cfg, fmt.Errorf("--pod-resources-list %q: want %s or %s", cfg.podResourcesList, listActive, listAll)
	}
	if cfg.topologyPolicy != "none" && cfg.numaNodes == 0 {
		return cfg, fmt.Errorf("--topology-manager-policy %s needs --numa-nodes >= 1", cfg.topologyPolicy)
	}
	var err error
	if cfg.labels, err = parseLabels(labels); err != nil {
		return cfg, err
	}
	if cfg.verbosity, err = parseLogLevel(logLevel); err != nil {
		return cfg, err
	}
	// kubelet's defaults: nodeLeaseDurationSeconds 40, renewed every quarter of it (10s).
	cfg.leaseDurationS = 40
	if min := int(4 * cfg.heartbeat / time.Second); min > cfg.leaseDurationS {
		cfg.leaseDurationS = min
	}
	return cfg, nil
}

// listGate is kubelet's feature gate that makes PodResources List return only active pods
// (pkg/features/kube_features.go: default off before 1.34, on from 1.34, to be locked on in 1.38).
const listGate = "KubeletPodResourcesListUseActivePods"

// setListGate sets kubelet's List gate for mode in the process's feature gates, which kubelet's
// own PodResources server reads (pkg/kubelet/apis/podresources/server_v1.go). Kubernetes
// modules before 1.34 have no such gate: their List always returns every pod (listAll), and
// listActive is refused there.
func setListGate(mode string) error {
	if _, known := utilfeature.DefaultMutableFeatureGate.GetAll()[listGate]; !known {
		if mode == listAll {
			return nil
		}
		return fmt.Errorf("--pod-resources-list=%s: this kubelet version has no %s gate; its List returns every pod (use --pod-resources-list=%s)", mode, listGate, listAll)
	}
	return utilfeature.DefaultMutableFeatureGate.Set(fmt.Sprintf("%s=%t", listGate, mode == listActive))
}

// maxSocketPath is the longest unix socket path (sun_path holds 108 bytes with the NUL).
const maxSocketPath = 107

// parseLabels parses "k=v,k=v" into a map, validating keys and values as label keys and values.
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("--labels: %q is not k=v", item)
		}
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, fmt.Errorf("--labels: key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, fmt.Errorf("--labels: value %q: %s", v, strings.Join(errs, "; "))
		}
		out[k] = v
	}
	return out, nil
}

// parseLogLevel maps a --log-level value to a klog verbosity.
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

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
