package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
)

// Labels kubelet puts on every container it creates (k8s.io/kubelet/pkg/types/labels.go).
const (
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelPodUID        = "io.kubernetes.pod.uid"
	labelContainerName = "io.kubernetes.container.name"
	// runSecondsAnnotation on a pod makes its app containers exit 0 after that many seconds.
	runSecondsAnnotation = "sim.nodelock.io/run-seconds"
)

// pods answers which containers of a pod are init containers that run to completion.
type pods interface {
	runToCompletion(ctx context.Context, namespace, name, uid string) (map[string]bool, error)
}

// apiPods reads the pod from the API server.
type apiPods struct{ client kubernetes.Interface }

func (a apiPods) runToCompletion(ctx context.Context, namespace, name, uid string) (map[string]bool, error) {
	pod, err := a.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if string(pod.UID) != uid {
		return nil, fmt.Errorf("pod %s/%s has UID %s, kubelet asked for %s", namespace, name, pod.UID, uid)
	}
	return initContainersThatExit(pod), nil
}

// initContainersThatExit names the pod's init containers that are not sidecars
// (restartPolicy Always): those run to completion before the next one starts.
func initContainersThatExit(pod *v1.Pod) map[string]bool {
	out := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy == nil || *c.RestartPolicy != v1.ContainerRestartPolicyAlways {
			out[c.Name] = true
		}
	}
	return out
}

// exitPlan says when a started container exits by itself: never (ok false), or after d with code 0.
func exitPlan(container string, runsToCompletion map[string]bool, podAnnotations map[string]string) (time.Duration, bool) {
	if runsToCompletion[container] {
		return 0, true
	}
	raw, found := podAnnotations[runSecondsAnnotation]
	if !found {
		return 0, false
	}
	secs, err := strconv.ParseFloat(raw, 64)
	if err != nil || secs < 0 {
		return 0, false
	}
	return time.Duration(secs * float64(time.Second)), true
}

// runtime is the CRI server: Kubernetes' fake runtime with recording, any image, and exits.
type runtime struct {
	*fake.RemoteRuntime
	recorder *recorder
	pods     pods

	mu    sync.Mutex
	plans map[string]time.Duration // container ID -> when it exits after start
}

func newRuntime(rec *recorder, p pods) *runtime {
	base := fake.NewFakeRemoteRuntime()
	base.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{
		Conditions: []*kubeapi.RuntimeCondition{
			{Type: kubeapi.RuntimeReady, Status: true},
			{Type: kubeapi.NetworkReady, Status: true},
		},
	}
	base.RuntimeService.FakeLinuxConfiguration = &kubeapi.LinuxRuntimeConfiguration{CgroupDriver: kubeapi.CgroupDriver_CGROUPFS}
	return &runtime{RemoteRuntime: base, recorder: rec, pods: p, plans: map[string]time.Duration{}}
}

// CreateContainer records the config kubelet hands over, then creates the fake container.
func (r *runtime) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	cfg := req.GetConfig()
	labels := cfg.GetLabels()
	ns, name, uid := labels[labelPodNamespace], labels[labelPodName], labels[labelPodUID]
	container := labels[labelContainerName]
	if container == "" {
		container = cfg.GetMetadata().GetName()
	}
	initOnes, err := r.pods.runToCompletion(ctx, ns, name, uid)
	if err != nil {
		return nil, fmt.Errorf("nodelock-cri: cannot read pod %s/%s to know its init containers: %w", ns, name, err)
	}
	after, exits := exitPlan(container, initOnes, req.GetSandboxConfig().GetAnnotations())
	entry := recordOf(req, initOnes[container])
	if err := r.recorder.write(entry); err != nil {
		return nil, fmt.Errorf("nodelock-cri: cannot record the container config: %w", err)
	}
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	if exits {
		r.mu.Lock()
		r.plans[resp.GetContainerId()] = after
		r.mu.Unlock()
	}
	klog.InfoS("Created container", "pod", ns+"/"+name, "container", container, "id", resp.GetContainerId(), "exitsAfter", planText(after, exits))
	return resp, nil
}

func planText(after time.Duration, exits bool) string {
	if !exits {
		return "never"
	}
	return after.String()
}

// StartContainer starts the fake container and, if it runs to completion, lets it exit.
func (r *runtime) StartContainer(ctx context.Context, req *kubeapi.StartContainerRequest) (*kubeapi.StartContainerResponse, error) {
	resp, err := r.RemoteRuntime.StartContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	id := req.GetContainerId()
	r.mu.Lock()
	after, exits := r.plans[id]
	delete(r.plans, id)
	r.mu.Unlock()
	if exits {
		time.AfterFunc(after, func() { r.exit(id) })
	}
	return resp, nil
}

// killedExitCode is what a runtime reports for a container kubelet stopped: its process killed
// by SIGKILL once the grace period ran out (128+9), as for a process that ignores SIGTERM, like a
// container's PID 1 without a handler.
const killedExitCode = 137

// StopContainer stops the fake container as kubelet asks; a container that was running reports
// exit code 137 and reason "Error" (containerd's reason for a non-zero exit), not the fake's 0,
// so a pod kubelet kills is Failed, as on a real runtime, rather than Succeeded.
func (r *runtime) StopContainer(ctx context.Context, req *kubeapi.StopContainerRequest) (*kubeapi.StopContainerResponse, error) {
	svc := r.RuntimeService
	svc.Lock()
	c, ok := svc.Containers[req.GetContainerId()]
	wasRunning := ok && c.State == kubeapi.ContainerState_CONTAINER_RUNNING
	svc.Unlock()
	resp, err := r.RemoteRuntime.StopContainer(ctx, req)
	if err != nil || !wasRunning {
		return resp, err
	}
	svc.Lock()
	defer svc.Unlock()
	if c, ok := svc.Containers[req.GetContainerId()]; ok && c.State == kubeapi.ContainerState_CONTAINER_EXITED {
		c.ExitCode = killedExitCode
		c.Reason = "Error"
	}
	return resp, nil
}

// exit marks a running container exited with code 0, as a process that finished would be.
func (r *runtime) exit(id string) {
	svc := r.RuntimeService
	svc.Lock()
	defer svc.Unlock()
	c, ok := svc.Containers[id]
	if !ok || c.State != kubeapi.ContainerState_CONTAINER_RUNNING {
		return
	}
	c.State = kubeapi.ContainerState_CONTAINER_EXITED
	c.FinishedAt = time.Now().UnixNano()
	c.ExitCode = 0
	c.Reason = "Completed"
	klog.InfoS("Container exited", "id", id, "exitCode", 0)
}

// imageOf is the image every reference resolves to: present, with a stable ID.
func imageOf(spec *kubeapi.ImageSpec) *kubeapi.Image {
	sum := sha256.Sum256([]byte(spec.GetImage()))
	return &kubeapi.Image{
		Id:       "sha256:" + hex.EncodeToString(sum[:]),
		RepoTags: []string{spec.GetImage()},
		Size:     1,
		Spec:     spec,
	}
}

// ImageStatus answers that every image is present, so kubelet never pulls.
func (r *runtime) ImageStatus(_ context.Context, req *kubeapi.ImageStatusRequest) (*kubeapi.ImageStatusResponse, error) {
	return &kubeapi.ImageStatusResponse{Image: imageOf(req.GetImage())}, nil
}

// PullImage succeeds at once for any image.
func (r *runtime) PullImage(_ context.Context, req *kubeapi.PullImageRequest) (*kubeapi.PullImageResponse, error) {
	return &kubeapi.PullImageResponse{ImageRef: imageOf(req.GetImage()).Id}, nil
}

// ImageFsInfo reports an empty image filesystem (kubelet's image GC then has nothing to do).
func (r *runtime) ImageFsInfo(_ context.Context, _ *kubeapi.ImageFsInfoRequest) (*kubeapi.ImageFsInfoResponse, error) {
	return &kubeapi.ImageFsInfoResponse{}, nil
}
