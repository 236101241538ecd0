package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	critesting "k8s.io/cri-api/pkg/apis/testing"
)

func TestInitContainersThatExitLeavesSidecarsRunning(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	pod := &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{{Name: "setup"}, {Name: "proxy", RestartPolicy: &always}},
		Containers:     []v1.Container{{Name: "train"}},
	}}
	got := initContainersThatExit(pod)
	if !got["setup"] || got["proxy"] || got["train"] || len(got) != 1 {
		t.Fatalf("init containers that exit: %v, want only setup", got)
	}
}

func TestExitPlan(t *testing.T) {
	init := map[string]bool{"setup": true}
	cases := []struct {
		container   string
		annotations map[string]string
		after       time.Duration
		exits       bool
	}{
		{"setup", nil, 0, true},
		{"train", nil, 0, false},
		{"train", map[string]string{runSecondsAnnotation: "2"}, 2 * time.Second, true},
		{"train", map[string]string{runSecondsAnnotation: "0.5"}, 500 * time.Millisecond, true},
		{"train", map[string]string{runSecondsAnnotation: "soon"}, 0, false},
		{"train", map[string]string{runSecondsAnnotation: "-1"}, 0, false},
		{"setup", map[string]string{runSecondsAnnotation: "9"}, 0, true},
	}
	for _, c := range cases {
		after, exits := exitPlan(c.container, init, c.annotations)
		if after != c.after || exits != c.exits {
			t.Errorf("exitPlan(%s, %v) = %v, %v; want %v, %v", c.container, c.annotations, after, exits, c.after, c.exits)
		}
	}
}

func TestRecordKeepsWhatTheDevicePluginAskedFor(t *testing.T) {
	req := &kubeapi.CreateContainerRequest{Config: &kubeapi.ContainerConfig{
		Metadata: &kubeapi.ContainerMetadata{Name: "train", Attempt: 1},
		Image:    &kubeapi.ImageSpec{Image: "busybox"},
		Labels: map[string]string{
			labelPodNamespace: "ns", labelPodName: "p", labelPodUID: "u-1", labelContainerName: "train",
		},
		Envs:        []*kubeapi.KeyValue{{Key: "NVIDIA_VISIBLE_DEVICES", Value: []byte("GPU-1,GPU-0")}},
		Devices:     []*kubeapi.Device{{HostPath: "/dev/nvidia0", ContainerPath: "/dev/nvidia0", Permissions: "rw"}},
		Mounts:      []*kubeapi.Mount{{HostPath: "/h", ContainerPath: "/c", Readonly: true}},
		CDIDevices:  []*kubeapi.CDIDevice{{Name: "nvidia.com/gpu=1"}, {Name: "nvidia.com/gpu=0"}},
		Annotations: map[string]string{"a": "b"},
	}}
	path := filepath.Join(t.TempDir(), "containers.jsonl")
	rec, err := openRecorder(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.write(recordOf(req, false)); err != nil {
		t.Fatal(err)
	}
	if err := rec.write(recordOf(req, false)); err != nil {
		t.Fatal(err)
	}
	rec.close()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one line per CreateContainer, got %d", len(lines))
	}
	var got containerRecord
	if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
		t.Fatal(err)
	}
	if got.Namespace != "ns" || got.Pod != "p" || got.PodUID != "u-1" || got.Container != "train" || got.Attempt != 1 {
		t.Errorf("identity: %+v", got)
	}
	if got.Envs["NVIDIA_VISIBLE_DEVICES"] != "GPU-1,GPU-0" {
		t.Errorf("envs: %v", got.Envs)
	}
	if len(got.Devices) != 1 || got.Devices[0].HostPath != "/dev/nvidia0" || got.Devices[0].Permissions != "rw" {
		t.Errorf("devices: %v", got.Devices)
	}
	if len(got.Mounts) != 1 || !got.Mounts[0].ReadOnly {
		t.Errorf("mounts: %v", got.Mounts)
	}
	if strings.Join(got.CDIDevices, " ") != "nvidia.com/gpu=0 nvidia.com/gpu=1" {
		t.Errorf("cdi devices: %v", got.CDIDevices)
	}
	if got.Annotations["a"] != "b" {
		t.Errorf("annotations: %v", got.Annotations)
	}
}

func TestAnyImageIsPresent(t *testing.T) {
	r := newRuntime(nil, nil)
	resp, err := r.ImageStatus(t.Context(), &kubeapi.ImageStatusRequest{Image: &kubeapi.ImageSpec{Image: "registry.example/never-pulled:1"}})
	if err != nil || resp.GetImage() == nil || !strings.HasPrefix(resp.GetImage().GetId(), "sha256:") {
		t.Fatalf("ImageStatus: %v, %v", resp, err)
	}
}

func TestStopContainerReportsAKilledProcess(t *testing.T) {
	r := newRuntime(nil, nil)
	r.RuntimeService.SetFakeContainers([]*critesting.FakeContainer{
		{ContainerStatus: kubeapi.ContainerStatus{Id: "running", State: kubeapi.ContainerState_CONTAINER_RUNNING}},
		{ContainerStatus: kubeapi.ContainerStatus{Id: "finished", State: kubeapi.ContainerState_CONTAINER_EXITED, ExitCode: 0, Reason: "Completed"}},
	})
	for _, id := range []string{"running", "finished"} {
		if _, err := r.StopContainer(t.Context(), &kubeapi.StopContainerRequest{ContainerId: id, Timeout: 30}); err != nil {
			t.Fatalf("StopContainer(%s): %v", id, err)
		}
	}
	status := func(id string) *kubeapi.ContainerStatus {
		resp, err := r.ContainerStatus(t.Context(), &kubeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			t.Fatalf("ContainerStatus(%s): %v", id, err)
		}
		return resp.GetStatus()
	}
	if s := status("running"); s.GetState() != kubeapi.ContainerState_CONTAINER_EXITED || s.GetExitCode() != 137 || s.GetReason() != "Error" {
		t.Errorf("stopped while running: %v", s)
	}
	if s := status("finished"); s.GetExitCode() != 0 || s.GetReason() != "Completed" {
		t.Errorf("stopped after it exited by itself: %v", s)
	}
}
