package main

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func podAt(name string, created time.Time) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(created)}}
}

// kubelet admits batch by batch in arrival order, each batch by creation time: a younger pod
// that arrived alone before an older one is admitted first; the first listing is one batch.
func TestAdmissionOrderBatchesThenCreation(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pods := []*v1.Pod{
		podAt("old-late", t0),                        // arrived in batch 2
		podAt("young-early", t0.Add(time.Minute)),    // arrived in batch 1
		podAt("listed-b", t0.Add(2*time.Minute)),     // first listing
		podAt("listed-a", t0.Add(-time.Minute)),      // first listing
		podAt("same-batch-y", t0.Add(3*time.Minute)), // batch 3
	}
	batch := map[types.UID]uint64{"uid-old-late": 2, "uid-young-early": 1, "uid-listed-b": 0, "uid-listed-a": 0, "uid-same-batch-y": 3}
	admissionOrder(pods, func(uid types.UID) uint64 { return batch[uid] })
	var got []string
	for _, p := range pods {
		got = append(got, p.Name)
	}
	want := "listed-a listed-b young-early old-late same-batch-y"
	if strings.Join(got, " ") != want {
		t.Fatalf("admission order %v, want %s", got, want)
	}
}

func TestArrivalBatches(t *testing.T) {
	s := &simKubelet{arrival: map[types.UID]uint64{}}
	s.arrived("a", true)
	s.arrived("b", false)
	s.arrived("c", false)
	s.arrived("b", false) // a pod already recorded keeps its batch
	if s.arrivalOf("a") != 0 || s.arrivalOf("b") != 1 || s.arrivalOf("c") != 2 {
		t.Fatalf("batches a=%d b=%d c=%d", s.arrivalOf("a"), s.arrivalOf("b"), s.arrivalOf("c"))
	}
	s.forget("b")
	if s.arrivalOf("b") != 0 {
		t.Fatal("a forgotten pod kept its batch")
	}
}

func sleepHook(seconds int64) *v1.Lifecycle {
	return &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Sleep: &v1.SleepAction{Seconds: seconds}}}
}

func TestStopDelayPreStopSleepBoundedByGrace(t *testing.T) {
	grace := func(s int64) *int64 { return &s }
	pod := &v1.Pod{Spec: v1.PodSpec{
		TerminationGracePeriodSeconds: grace(30),
		Containers:                    []v1.Container{{Name: "a", Lifecycle: sleepHook(4)}, {Name: "b", Lifecycle: sleepHook(7)}, {Name: "c"}},
	}}
	if d := stopDelay(pod, true); d != 7*time.Second {
		t.Fatalf("longest hook: %v", d)
	}
	if d := stopDelay(pod, false); d != 0 {
		t.Fatalf("no running containers, no hooks: %v", d)
	}
	pod.DeletionGracePeriodSeconds = grace(5)
	if d := stopDelay(pod, true); d != 5*time.Second {
		t.Fatalf("bounded by the deletion's grace period: %v", d)
	}
	pod.DeletionGracePeriodSeconds = grace(0)
	if d := stopDelay(pod, true); d != 0 {
		t.Fatalf("grace 0 runs no hook: %v", d)
	}
	pod.DeletionGracePeriodSeconds = nil
	pod.Spec.TerminationGracePeriodSeconds = nil
	pod.Spec.Containers[1].Lifecycle = sleepHook(45)
	if d := stopDelay(pod, true); d != 30*time.Second {
		t.Fatalf("default grace period bounds the hook: %v", d)
	}
	always := v1.ContainerRestartPolicyAlways
	sidecar := &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{{Name: "side", RestartPolicy: &always, Lifecycle: sleepHook(3)}, {Name: "init", Lifecycle: sleepHook(9)}},
		Containers:     []v1.Container{{Name: "main"}},
	}}
	if d := stopDelay(sidecar, true); d != 3*time.Second {
		t.Fatalf("a sidecar's hook runs, a completed init container's does not: %v", d)
	}
}

func TestRestartDelayIsKubeletsBackOff(t *testing.T) {
	want := []time.Duration{0, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second, 5 * time.Minute, 5 * time.Minute}
	for n, w := range want {
		if d := restartDelay(int32(n)); d != w {
			t.Fatalf("restartDelay(%d) = %v, want %v", n, d, w)
		}
	}
}

func TestRestartsExited(t *testing.T) {
	for policy, want := range map[v1.RestartPolicy]bool{"": true, v1.RestartPolicyAlways: true, v1.RestartPolicyOnFailure: false, v1.RestartPolicyNever: false} {
		if got := restartsExited(&v1.Pod{Spec: v1.PodSpec{RestartPolicy: policy}}); got != want {
			t.Fatalf("restartPolicy %q: %v", policy, got)
		}
	}
}

func TestRunningContainersFromPodStatuses(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u1"}, Status: v1.PodStatus{
		InitContainerStatuses: []v1.ContainerStatus{{Name: "setup", ContainerID: "sim://u1/setup", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{}}}},
		ContainerStatuses: []v1.ContainerStatus{
			{Name: "main", ContainerID: "sim://u1/main", State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}},
			{Name: "waiting"},
		},
	}}
	pod.Spec.Containers = []v1.Container{{Name: "main"}, {Name: "waiting"}}
	cm, running := runningContainers([]*v1.Pod{pod}, time.Now())
	if id, err := cm.GetContainerID("u1", "main"); err != nil || id != "sim://u1/main" {
		t.Fatalf("main: %q %v", id, err)
	}
	if _, err := cm.GetContainerID("u1", "setup"); err != nil {
		t.Fatalf("setup is a container the runtime knows: %v", err)
	}
	if _, err := cm.GetContainerID("u1", "waiting"); err == nil {
		t.Fatal("a container without an ID was mapped")
	}
	if running.Len() != 1 || !running.Has("sim://u1/main") {
		t.Fatalf("running set %v", running.UnsortedList())
	}
	// a container whose run time ended while no kubelet ran has exited
	started := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod.Annotations = map[string]string{runSecondsAnnotation: "4"}
	pod.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.NewTime(started)
	if _, running := runningContainers([]*v1.Pod{pod}, started.Add(3*time.Second)); !running.Has("sim://u1/main") {
		t.Fatal("a container within its run time is not running")
	}
	if _, running := runningContainers([]*v1.Pod{pod}, started.Add(4*time.Second)); running.Len() != 0 {
		t.Fatalf("a container past its run time is running: %v", running.UnsortedList())
	}
}
