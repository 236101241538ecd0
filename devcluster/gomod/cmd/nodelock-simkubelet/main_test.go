package main

import (
	"io"
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
)

func TestParseFlagsDefaultsAndRequired(t *testing.T) {
	cfg, err := parseFlags([]string{"--kubeconfig", "/k", "--node-name=gpu-node-01"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.resourceName != "nvidia.com/gpu" || cfg.heartbeat != 10*time.Second || cfg.startDelay != 0 || cfg.leaseDurationS != 40 || cfg.verbosity != 0 {
		t.Fatalf("unexpected defaults: %+v", cfg)
	}
	for _, args := range [][]string{
		{"--node-name=n"},
		{"--kubeconfig=/k"},
		{"--kubeconfig=/k", "--node-name=Bad_Name"},
		{"--kubeconfig=/k", "--node-name=n", "--resource-name=gpu"},
		{"--kubeconfig=/k", "--node-name=n", "--start-delay=-1s"},
		{"--kubeconfig=/k", "--node-name=n", "--labels=novalue"},
		{"--kubeconfig=/k", "--node-name=n", "--log-level=loud"},
		{"--kubeconfig=/k", "--node-name=n", "extra"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func TestParseFlagsTopologyManager(t *testing.T) {
	cfg, err := parseFlags([]string{"--kubeconfig=/k", "--node-name=n", "--topology-manager-policy=single-numa-node", "--numa-nodes=2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.topologyPolicy != "single-numa-node" || cfg.numaNodes != 2 {
		t.Fatalf("unexpected topology settings: %+v", cfg)
	}
	if got := numaTopology(2); len(got) != 2 || got[0].Id != 0 || got[1].Id != 1 {
		t.Fatalf("numaTopology(2) = %+v", got)
	}
	if numaTopology(0) != nil {
		t.Fatal("numaTopology(0) is not nil")
	}
	for _, args := range [][]string{
		{"--kubeconfig=/k", "--node-name=n", "--topology-manager-policy=strict", "--numa-nodes=2"},
		{"--kubeconfig=/k", "--node-name=n", "--topology-manager-policy=restricted"},
		{"--kubeconfig=/k", "--node-name=n", "--numa-nodes=9"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func TestParseLabels(t *testing.T) {
	got, err := parseLabels("zone=a, nodelock.io/pool=train,,")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"zone": "a", "nodelock.io/pool": "train"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
	if _, err := parseLabels("bad key=x"); err == nil {
		t.Fatal("accepted a key with a space")
	}
}

func TestParseLogLevel(t *testing.T) {
	for in, want := range map[string]int{"info": 0, "DEBUG": 2, "trace": 5, "3": 3} {
		if got, err := parseLogLevel(in); err != nil || got != want {
			t.Errorf("parseLogLevel(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := parseLogLevel("-1"); err == nil {
		t.Error("accepted -1")
	}
}

func TestBuildContainerRecord(t *testing.T) {
	devs := devicemanager.ResourceDeviceInstances{
		"nvidia.com/gpu":  {"GPU-b": &pluginapi.Device{ID: "GPU-b"}, "GPU-a": &pluginapi.Device{ID: "GPU-a"}},
		"example.com/nic": {"nic0": &pluginapi.Device{ID: "nic0"}},
	}
	opts := &devicemanager.DeviceRunContainerOptions{
		Envs:       []kubecontainer.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "GPU-a,GPU-b"}},
		Devices:    []kubecontainer.DeviceInfo{{PathOnHost: "/dev/nvidia0", PathInContainer: "/dev/nvidia0", Permissions: "rw"}},
		CDIDevices: []kubecontainer.CDIDevice{{Name: "nvidia.com/gpu=1"}, {Name: "nvidia.com/gpu=0"}},
	}
	rec, ok := buildContainerRecord("nvidia.com/gpu", devs, opts)
	if !ok {
		t.Fatal("no record")
	}
	got, err := encodeAllocated(map[string]containerRecord{"train": rec})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"train":{"deviceIDs":["GPU-a","GPU-b"],"envs":{"NVIDIA_VISIBLE_DEVICES":"GPU-a,GPU-b"},` +
		`"devices":[{"hostPath":"/dev/nvidia0","containerPath":"/dev/nvidia0","permissions":"rw"}],` +
		`"cdiDevices":["nvidia.com/gpu=0","nvidia.com/gpu=1"],"otherResources":{"example.com/nic":["nic0"]}}}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}

	if _, ok := buildContainerRecord("nvidia.com/gpu", devicemanager.ResourceDeviceInstances{"nvidia.com/gpu": {}}, nil); ok {
		t.Fatal("a container without devices got a record")
	}
	rec, ok = buildContainerRecord("nvidia.com/gpu", devicemanager.ResourceDeviceInstances{"nvidia.com/gpu": {"GPU-a": &pluginapi.Device{}}}, nil)
	if !ok || !reflect.DeepEqual(rec.DeviceIDs, []string{"GPU-a"}) || rec.Envs == nil {
		t.Fatalf("record without run options: %+v", rec)
	}
}

func TestRunDuration(t *testing.T) {
	pod := func(v string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{runSecondsAnnotation: v}}}
	}
	if d, ok, err := runDuration(pod("2.5")); err != nil || !ok || d != 2500*time.Millisecond {
		t.Fatalf("2.5 -> %v %v %v", d, ok, err)
	}
	if _, ok, err := runDuration(&v1.Pod{}); ok || err != nil {
		t.Fatal("absent annotation")
	}
	for _, bad := range []string{"-1", "soon", ""} {
		if _, ok, err := runDuration(pod(bad)); ok || err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestPodContainersOrder(t *testing.T) {
	pod := &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{{Name: "setup"}},
		Containers:     []v1.Container{{Name: "train"}, {Name: "log"}},
	}}
	var names []string
	for _, c := range podContainers(pod) {
		names = append(names, c.Name)
	}
	if !reflect.DeepEqual(names, []string{"setup", "train", "log"}) {
		t.Fatalf("order %v", names)
	}
}

func TestDesiredConditionsKeepTransitionTime(t *testing.T) {
	then := metav1.NewTime(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	now := metav1.NewTime(then.Add(time.Hour))
	old := []v1.NodeCondition{
		{Type: v1.NodeReady, Status: v1.ConditionTrue, LastTransitionTime: then},
		{Type: v1.NodeMemoryPressure, Status: v1.ConditionUnknown, LastTransitionTime: then},
	}
	for _, c := range desiredConditions(old, now) {
		want := now
		if c.Type == v1.NodeReady {
			want = then
		}
		if !c.LastTransitionTime.Equal(&want) || !c.LastHeartbeatTime.Equal(&now) {
			t.Errorf("%s: transition %v heartbeat %v", c.Type, c.LastTransitionTime, c.LastHeartbeatTime)
		}
	}
}
