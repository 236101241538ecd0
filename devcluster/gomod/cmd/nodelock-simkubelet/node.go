package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"
	v1helper "k8s.io/kubernetes/pkg/apis/core/v1/helper"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

const (
	simulatedLabel = "nodelock.io/simulated"
	kubeletVersion = "v1.37.2-nodelock-sim"
	// statusCheckInterval is how often device capacity and the Node's conditions are compared
	// with what should be reported (cheap: in memory and the informer cache).
	statusCheckInterval = time.Second
)

// baseCapacity is the simulated machine: what cAdvisor would report for a large GPU host.
func baseCapacity() v1.ResourceList {
	return v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse("64"),
		v1.ResourceMemory: resource.MustParse("512Gi"),
		v1.ResourcePods:   resource.MustParse("110"),
	}
}

// nodeStatusManager registers the Node and keeps its status as kubelet's node status setters
// would: base machine capacity plus the device manager's GetCapacity, and Ready.
type nodeStatusManager struct {
	client       kubernetes.Interface
	nodeName     string
	labels       map[string]string
	statusReport time.Duration
	dm           *devicemanager.ManagerImpl
	nodeLister   corelisters.NodeLister

	// Device plugin resources as last computed from GetCapacity (kubelet keeps them on the
	// Node object; we keep them here and patch).
	extCapacity    v1.ResourceList
	extAllocatable v1.ResourceList
	// removed holds resources GetCapacity reported deleted that must be removed from the Node.
	removed    sets.Set[string]
	lastReport time.Time
	lastLogged string
}

func newNodeStatusManager(client kubernetes.Interface, cfg config, dm *devicemanager.ManagerImpl, nodeLister corelisters.NodeLister) *nodeStatusManager {
	labels := map[string]string{
		v1.LabelHostname:   cfg.nodeName,
		v1.LabelOSStable:   "linux",
		v1.LabelArchStable: runtime.GOARCH,
		simulatedLabel:     "true",
	}
	for k, v := range cfg.labels {
		labels[k] = v
	}
	return &nodeStatusManager{
		client:         client,
		nodeName:       cfg.nodeName,
		labels:         labels,
		statusReport:   cfg.statusReport,
		dm:             dm,
		nodeLister:     nodeLister,
		extCapacity:    v1.ResourceList{},
		extAllocatable: v1.ResourceList{},
		removed:        sets.New[string](),
	}
}

// register creates the Node, or patches our labels onto an existing one (never touching
// annotations or other labels), retrying until it succeeds or ctx ends. Like kubelet, when the
// device manager has no checkpoint (a new node) the extended resources left on an existing Node
// are reset to zero until plugins register.
func (n *nodeStatusManager) register(ctx context.Context) error {
	return wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: 5 * time.Second},
		func(ctx context.Context) (bool, error) {
			if err := n.registerOnce(ctx); err != nil {
				klog.ErrorS(err, "Unable to register node, will retry", "node", n.nodeName)
				return false, nil
			}
			return true, nil
		})
}

func (n *nodeStatusManager) registerOnce(ctx context.Context) error {
	node, err := n.client.CoreV1().Nodes().Get(ctx, n.nodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		now := metav1.Now()
		node = &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.nodeName, Labels: n.labels},
			Status: v1.NodeStatus{
				Capacity:    mergeLists(baseCapacity(), n.extCapacity),
				Allocatable: mergeLists(baseCapacity(), n.extAllocatable),
				Conditions:  desiredConditions(nil, now),
				NodeInfo:    nodeInfo(),
			},
		}
		if _, err := n.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create node: %w", err)
		}
		klog.InfoS("Registered node", "node", n.nodeName)
		return nil
	}
	if err != nil {
		return fmt.Errorf("get node: %w", err)
	}
	if n.dm.ShouldResetExtendedResourceCapacity() {
		for name := range node.Status.Capacity {
			if v1helper.IsExtendedResourceName(name) {
				if _, known := n.extCapacity[name]; !known {
					n.extCapacity[name] = resource.MustParse("0")
					n.extAllocatable[name] = resource.MustParse("0")
				}
			}
		}
	}
	missing := map[string]string{}
	for k, v := range n.labels {
		if node.Labels[k] != v {
			missing[k] = v
		}
	}
	if len(missing) > 0 {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": missing}})
		if _, err := n.client.CoreV1().Nodes().Patch(ctx, n.nodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("patch node labels: %w", err)
		}
	}
	klog.InfoS("Node already registered", "node", n.nodeName)
	return nil
}

// run keeps the Node status current until ctx ends.
func (n *nodeStatusManager) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := n.sync(ctx, logger); err != nil {
			klog.ErrorS(err, "Node status update failed, will retry", "node", n.nodeName)
		}
	}, statusCheckInterval)
}

// sync folds GetCapacity into the tracked device resources and patches the Node status when it
// differs from what should be reported or the report interval has passed.
func (n *nodeStatusManager) sync(ctx context.Context, logger klog.Logger) error {
	capacity, allocatable, removed := n.dm.GetCapacity(logger)
	for k, v := range capacity {
		n.extCapacity[k] = v
	}
	for k, v := range allocatable {
		n.extAllocatable[k] = v
	}
	for _, r := range removed {
		name := v1.ResourceName(r)
		delete(n.extCapacity, name)
		delete(n.extAllocatable, name)
		n.removed.Insert(r)
	}
	if s := describeResources(n.extCapacity, n.extAllocatable); s != n.lastLogged {
		klog.InfoS("Device plugin resources", "node", n.nodeName, "capacity/allocatable", s, "removed", sets.List(n.removed))
		n.lastLogged = s
	}

	node, err := n.nodeLister.Get(n.nodeName)
	if apierrors.IsNotFound(err) {
		// Deleted behind our back (or the informer has not seen it yet): register again.
		if _, getErr := n.client.CoreV1().Nodes().Get(ctx, n.nodeName, metav1.GetOptions{}); apierrors.IsNotFound(getErr) {
			klog.InfoS("Node object is gone, registering again", "node", n.nodeName)
			return n.registerOnce(ctx)
		}
		return nil
	}
	if err != nil {
		return err
	}
	now := metav1.Now()
	due := time.Since(n.lastReport) >= n.statusReport
	if !due && n.upToDate(node) {
		return nil
	}
	patch, err := n.statusPatch(node, now)
	if err != nil {
		return err
	}
	if _, err := n.client.CoreV1().Nodes().PatchStatus(ctx, n.nodeName, patch); err != nil {
		return fmt.Errorf("patch node status: %w", err)
	}
	n.lastReport = time.Now()
	n.removed = sets.New[string]()
	return nil
}

// upToDate reports whether the Node already shows what we would report (heartbeat aside).
func (n *nodeStatusManager) upToDate(node *v1.Node) bool {
	wantCap := mergeLists(baseCapacity(), n.extCapacity)
	wantAlloc := mergeLists(baseCapacity(), n.extAllocatable)
	for k, v := range wantCap {
		if got, ok := node.Status.Capacity[k]; !ok || got.Cmp(v) != 0 {
			return false
		}
	}
	for k, v := range wantAlloc {
		if got, ok := node.Status.Allocatable[k]; !ok || got.Cmp(v) != 0 {
			return false
		}
	}
	for r := range n.removed {
		if _, ok := node.Status.Capacity[v1.ResourceName(r)]; ok {
			return false
		}
		if _, ok := node.Status.Allocatable[v1.ResourceName(r)]; ok {
			return false
		}
	}
	for _, want := range desiredConditions(nil, metav1.Now()) {
		found := false
		for _, c := range node.Status.Conditions {
			if c.Type == want.Type {
				found = c.Status == want.Status
			}
		}
		if !found {
			return false
		}
	}
	return node.Status.NodeInfo.KubeletVersion == kubeletVersion
}

// statusPatch is a strategic merge patch for nodes/status: capacity and allocatable (removed
// resources set to null), conditions (merged by type), nodeInfo.
func (n *nodeStatusManager) statusPatch(node *v1.Node, now metav1.Time) ([]byte, error) {
	capacity := map[string]any{}
	allocatable := map[string]any{}
	for k, v := range mergeLists(baseCapacity(), n.extCapacity) {
		capacity[string(k)] = v.String()
	}
	for k, v := range mergeLists(baseCapacity(), n.extAllocatable) {
		allocatable[string(k)] = v.String()
	}
	for r := range n.removed {
		if _, ok := capacity[r]; !ok {
			capacity[r] = nil
		}
		if _, ok := allocatable[r]; !ok {
			allocatable[r] = nil
		}
	}
	return json.Marshal(map[string]any{"status": map[string]any{
		"capacity":    capacity,
		"allocatable": allocatable,
		"conditions":  desiredConditions(node.Status.Conditions, now),
		"nodeInfo":    nodeInfo(),
	}})
}

// desiredConditions are kubelet's node conditions for a healthy node; a condition keeps its
// lastTransitionTime when its status does not change.
func desiredConditions(old []v1.NodeCondition, now metav1.Time) []v1.NodeCondition {
	want := []v1.NodeCondition{
		{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"},
		{Type: v1.NodeDiskPressure, Status: v1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure"},
		{Type: v1.NodePIDPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available"},
		{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status (simulated node: nodelock-simkubelet)"},
	}
	for i := range want {
		want[i].LastHeartbeatTime = now
		want[i].LastTransitionTime = now
		for _, c := range old {
			if c.Type == want[i].Type && c.Status == want[i].Status && !c.LastTransitionTime.IsZero() {
				want[i].LastTransitionTime = c.LastTransitionTime
			}
		}
	}
	return want
}

func nodeInfo() v1.NodeSystemInfo {
	return v1.NodeSystemInfo{
		KernelVersion:           "simulated",
		OSImage:                 "nodelock simulated node",
		ContainerRuntimeVersion: "sim://1",
		KubeletVersion:          kubeletVersion,
		OperatingSystem:         "linux",
		Architecture:            runtime.GOARCH,
	}
}

// mergeLists returns a copy of a with b's entries laid over it.
func mergeLists(a, b v1.ResourceList) v1.ResourceList {
	out := v1.ResourceList{}
	for k, v := range a {
		out[k] = v.DeepCopy()
	}
	for k, v := range b {
		out[k] = v.DeepCopy()
	}
	return out
}

// describeResources renders "name=capacity/allocatable" pairs, sorted.
func describeResources(capacity, allocatable v1.ResourceList) string {
	names := make([]string, 0, len(capacity))
	for k := range capacity {
		names = append(names, string(k))
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, k := range names {
		c := capacity[v1.ResourceName(k)]
		a := allocatable[v1.ResourceName(k)]
		parts = append(parts, fmt.Sprintf("%s=%s/%s", k, c.String(), a.String()))
	}
	return strings.Join(parts, ",")
}
