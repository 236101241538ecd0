package main

import (
	"io"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

func TestContainerDevicesOneEntryPerDeviceAndNUMANode(t *testing.T) {
	devs := devicemanager.ResourceDeviceInstances{
		"nvidia.com/gpu": {
			"GPU-a": &pluginapi.Device{ID: "GPU-a", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}},
			"GPU-b": &pluginapi.Device{ID: "GPU-b"},
		},
	}
	var got []string
	for _, d := range containerDevices(devs) {
		if d.ResourceName != "nvidia.com/gpu" || len(d.DeviceIds) != 1 {
			t.Fatalf("unexpected entry %v", d)
		}
		numa := "-"
		if d.Topology != nil {
			numa = ""
			for _, n := range d.Topology.Nodes {
				numa += string(rune('0' + n.ID))
			}
		}
		got = append(got, d.DeviceIds[0]+"@"+numa)
	}
	sort.Strings(got)
	if strings.Join(got, " ") != "GPU-a@1 GPU-b@-" {
		t.Fatalf("containerDevices = %v", got)
	}
	if out := containerDevices(nil); len(out) != 0 {
		t.Fatalf("no devices gave %v", out)
	}
}

func TestParseFlagsPodResourcesSocket(t *testing.T) {
	cfg, err := parseFlags([]string{"--kubeconfig=/k", "--node-name=n", "--pod-resources-socket=/run/pr/kubelet.sock"}, io.Discard)
	if err != nil || cfg.podResourcesSocket != "/run/pr/kubelet.sock" {
		t.Fatalf("parseFlags: %v %+v", err, cfg)
	}
	long := "/" + strings.Repeat("x", maxSocketPath)
	if _, err := parseFlags([]string{"--kubeconfig=/k", "--node-name=n", "--pod-resources-socket=" + long}, io.Discard); err == nil {
		t.Fatal("a socket path longer than sun_path was accepted")
	}
}

func TestManagedPodsHoldOnlyPodsAdmissionReached(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for name, phase := range map[string]v1.PodPhase{
		"admitting": v1.PodPending, "arrived": v1.PodPending, "rejected": v1.PodPending, "done": v1.PodSucceeded,
	} {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name)}, Status: v1.PodStatus{Phase: phase}}
		if err := idx.Add(pod); err != nil {
			t.Fatal(err)
		}
	}
	s := &simKubelet{podLister: corelisters.NewPodLister(idx), inactive: sets.New[types.UID](), received: sets.New[types.UID]()}
	for _, uid := range []types.UID{"admitting", "rejected", "done"} {
		s.setReceived(uid)
	}
	s.setInactive("rejected") // kubelet's status manager marks a rejected pod Failed at once
	var got []string
	for _, p := range s.managedPods() {
		got = append(got, p.Name)
	}
	// "arrived" waits behind the pod being admitted: not in kubelet's pod manager yet
	if strings.Join(got, " ") != "admitting" {
		t.Fatalf("managedPods = %v, want [admitting]", got)
	}
	s.forget("admitting")
	if out := s.managedPods(); len(out) != 0 {
		t.Fatalf("a forgotten pod is still managed: %v", out)
	}
}

func TestPodManagerHoldsRejectedAndFinishedPodsUntilDeleted(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for name, phase := range map[string]v1.PodPhase{
		"running": v1.PodRunning, "arrived": v1.PodPending, "rejected": v1.PodFailed, "job": v1.PodSucceeded, "old-done": v1.PodSucceeded,
	} {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name)}, Status: v1.PodStatus{Phase: phase}}
		if err := idx.Add(pod); err != nil {
			t.Fatal(err)
		}
	}
	s := &simKubelet{podLister: corelisters.NewPodLister(idx), inactive: sets.New[types.UID](), received: sets.New[types.UID]()}
	for _, uid := range []types.UID{"running", "rejected", "job"} {
		s.setReceived(uid)
	}
	s.setInactive("rejected")
	var got []string
	for _, p := range (podResourcesProviders{s: s}).GetPods() {
		got = append(got, p.Name)
	}
	sort.Strings(got)
	// "old-done" arrived finished: kubelet adds it to its pod manager without admitting it
	if strings.Join(got, " ") != "job old-done rejected running" {
		t.Fatalf("GetPods = %v", got)
	}
}

func TestParseFlagsPodResourcesList(t *testing.T) {
	cfg, err := parseFlags([]string{"--kubeconfig=/k", "--node-name=n"}, io.Discard)
	if err != nil || cfg.podResourcesList != listActive {
		t.Fatalf("default: %v %q", err, cfg.podResourcesList)
	}
	cfg, err = parseFlags([]string{"--kubeconfig=/k", "--node-name=n", "--pod-resources-list=all"}, io.Discard)
	if err != nil || cfg.podResourcesList != listAll {
		t.Fatalf("all: %v %q", err, cfg.podResourcesList)
	}
	if _, err := parseFlags([]string{"--kubeconfig=/k", "--node-name=n", "--pod-resources-list=some"}, io.Discard); err == nil {
		t.Fatal("--pod-resources-list=some was accepted")
	}
}

func TestSetListGateSwitchesKubeletsOwnGate(t *testing.T) {
	if _, known := utilfeature.DefaultMutableFeatureGate.GetAll()[listGate]; !known {
		if err := setListGate(listActive); err == nil {
			t.Fatal("active accepted on a kubelet without the gate")
		}
		if err := setListGate(listAll); err != nil {
			t.Fatal(err)
		}
		return
	}
	defer func() {
		if err := setListGate(listActive); err != nil {
			t.Fatal(err)
		}
	}()
	if err := setListGate(listAll); err != nil {
		t.Fatal(err)
	}
	if utilfeature.DefaultFeatureGate.Enabled(listGate) {
		t.Fatal("all left the gate on")
	}
	if err := setListGate(listActive); err != nil {
		t.Fatal(err)
	}
	if !utilfeature.DefaultFeatureGate.Enabled(listGate) {
		t.Fatal("active left the gate off")
	}
}

func TestRejectReasonDefaultsToNodeAffinity(t *testing.T) {
	if rejectReason("") != "NodeAffinity" || rejectReason("OutOfcpu") != "OutOfcpu" {
		t.Fatal("rejectReason")
	}
}
