package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/status"
	statusutil "k8s.io/kubernetes/pkg/util/pod"
)

var everything = labels.Everything()

const (
	// resyncInterval bounds how long the pod loop sleeps without an event.
	resyncInterval = 5 * time.Second
	// configRetryDelay is the wait before creating a container again after an error.
	configRetryDelay = 5 * time.Second
)

// podState is what this kubelet knows about one pod beyond the API object.
type podState struct {
	admitted bool // passed admission, or was already running when we started
	prepared bool // device run options fetched (kubelet's container creation step)
	// configErr is the last container creation error reported on the pod.
	configErr string
	// rejected is kubelet's admission result when admission failed.
	rejected *lifecycle.PodAdmitResult
	// record is the allocatedAnnotation value still to be written ("" when none / written).
	record       string
	startAt      time.Time // when the simulated containers are up
	running      bool      // Running written (or observed at startup)
	runningAt    time.Time
	finishAt     time.Time // zero: runs until deleted
	succeed      bool      // run time is over; Succeeded still to be written
	done         bool      // terminal status written
	deleting     bool      // delete (grace 0) issued
	deleteFailed bool      // the last delete failed; retry at retryAt
	retryAt      time.Time // earliest next attempt after a failed write
	healthSeen   bool      // a device health update arrived for this pod
	// stopAt is when a pod being deleted has its containers stopped (its preStop sleep hooks
	// over); until then it keeps its devices. Zero: its deletion not seen yet.
	stopAt time.Time
	// restarts is how often the app containers were restarted (restartPolicy Always);
	// restarting marks containers that exited and are not running again yet.
	restarts   int32
	restarting bool
	exitedAt   time.Time
	// records is the allocation record per container, kept so that a container restart
	// updates only its own entry.
	records map[string]containerRecord
	// last is the pod as returned by our last status write; staleRVs are the resourceVersions
	// our writes were based on, so an informer copy still at one of them is older than last.
	last     *v1.Pod
	staleRVs sets.Set[string]
}

// podWorker runs the pods bound to the node, one pass at a time, in creation order.
type podWorker struct {
	s     *simKubelet
	state map[types.UID]*podState
}

func newPodWorker(s *simKubelet) *podWorker {
	return &podWorker{s: s, state: map[types.UID]*podState{}}
}

// loop runs passes over the node's pods until ctx ends: on informer events, device health
// updates, the next due timer, and every resyncInterval.
func (w *podWorker) loop(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		next := w.pass(ctx)
		wait := resyncInterval
		if !next.IsZero() {
			if d := time.Until(next); d < wait {
				wait = max(d, 5*time.Millisecond)
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-w.s.wake:
		case <-timer.C:
		case upd := <-w.s.dm.Updates():
			for _, uid := range upd.PodUIDs {
				if st, ok := w.state[types.UID(uid)]; ok {
					st.healthSeen = true
				}
			}
		}
	}
}

// sortedPods lists the node's pods oldest first.
func (w *podWorker) sortedPods() ([]*v1.Pod, error) {
	pods, err := w.s.podLister.List(everything)
	if err != nil {
		return nil, err
	}
	admissionOrder(pods, func(types.UID) uint64 { return 0 })
	return pods, nil
}

// admissionOrder sorts pods as kubelet admits them: batch by batch in arrival order, each batch
// by creation time (HandlePodAdditions sorts the pods of one ADD by creation and admits them one
// after the other, pkg/kubelet/kubelet.go, v1.31.9 line 2536, v1.37.2 line 2886). Pods created
// at the same instant are taken by namespace and name, so the order is stable.
func admissionOrder(pods []*v1.Pod, batch func(types.UID) uint64) {
	sort.SliceStable(pods, func(i, j int) bool {
		a, b := pods[i], pods[j]
		if ba, bb := batch(a.UID), batch(b.UID); ba != bb {
			return ba < bb
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
}

func (w *podWorker) stateOf(pod *v1.Pod) *podState {
	st, ok := w.state[pod.UID]
	if !ok {
		st = &podState{}
		w.state[pod.UID] = st
	}
	return st
}

// admitArrivals admits every pod that waits for admission, in kubelet's order
// (admissionOrder), from the informer's current copy. Called before each pod's API writes:
// kubelet's syncLoop admits pods as they arrive while its status manager writes statuses on a
// goroutine of its own, so a status write never delays the next pod's admission (and so its
// device plugin Allocate) here either.
//
// As in kubelet's HandlePodAdditions (pkg/kubelet/kubelet.go, v1.31.9 line 2571, v1.37.2 line
// 2919), every pod this kubelet has not admitted yet and whose phase is not terminal is
// admitted: a pod already being deleted too (its pod worker has not seen it, so its termination
// is not requested), and a pod already running when this kubelet starts (kubelet gets every pod
// again as an ADD after a restart). The first batch, the pods of the first listing, is admitted
// while kubelet's sources are not ready; they are ready from the next batch on.
func (w *podWorker) admitArrivals(ctx context.Context) {
	pods, err := w.s.podLister.List(everything)
	if err != nil {
		return // the pass's own listing reports it
	}
	for _, pod := range pods {
		// a pod the informer has not reported yet arrives now (or with the first listing)
		w.s.arrived(pod.UID, !w.s.sourcesSeen.Load())
	}
	admissionOrder(pods, w.s.arrivalOf)
	for _, pod := range pods {
		if w.s.arrivalOf(pod.UID) > 0 {
			w.s.sourcesSeen.Store(true)
		}
		st := w.stateOf(pod)
		if st.admitted || st.rejected != nil || st.done {
			continue
		}
		switch pod.Status.Phase {
		case v1.PodPending, "":
			w.admit(ctx, pod, st, time.Now())
		case v1.PodRunning:
			w.admit(ctx, pod, st, time.Now())
			if st.admitted {
				w.adopt(pod, st, time.Now())
			}
		}
	}
	w.s.sourcesSeen.Store(true)
}

// pass handles every pod once, oldest first, and returns when it next has something due (zero:
// nothing scheduled).
func (w *podWorker) pass(ctx context.Context) time.Time {
	pods, err := w.sortedPods()
	if err != nil {
		klog.ErrorS(err, "Listing pods")
		return time.Now().Add(retryDelay)
	}
	var next time.Time
	for _, pod := range pods {
		w.admitArrivals(ctx)
		if due := w.syncPod(ctx, pod, w.stateOf(pod), time.Now()); !due.IsZero() && (next.IsZero() || due.Before(next)) {
			next = due
		}
	}
	current, err := w.sortedPods()
	if err != nil {
		return next
	}
	seen := map[types.UID]bool{}
	for _, pod := range current {
		seen[pod.UID] = true
	}
	for uid := range w.state {
		if !seen[uid] {
			delete(w.state, uid)
			w.s.forget(uid)
		}
	}
	// a pod that arrived during the pass (admitted above) kicked the loop: the next pass
	// writes its record and status
	return next
}

// syncPod moves one pod along: delete → admit → record → Running → Succeeded. It returns
// when the pod next needs attention (zero: only on an event).
func (w *podWorker) syncPod(ctx context.Context, pod *v1.Pod, st *podState, now time.Time) time.Time {
	ref := klog.KObj(pod)

	// Graceful deletion: the pod keeps its devices until its containers have stopped, after
	// their preStop sleep hooks (bounded by the grace period), as kubelet's pod worker kills
	// them (killContainer, pkg/kubelet/kuberuntime/kuberuntime_container.go, v1.31.9 line 792,
	// v1.37.2 line 896) and counts the pod active until it is known terminated (in
	// pkg/kubelet/kubelet_pods.go: filterOutInactivePods, v1.31.9 line 1058; isPodInactive,
	// v1.37.2 line 1166). A pod rejected at admission gets its Failed status first. Then, as
	// kubelet's status manager does once a pod is terminated, it is deleted with grace period 0.
	if pod.DeletionTimestamp != nil {
		if st.deleting {
			return time.Time{}
		}
		if st.rejected != nil && !st.done {
			if due := w.write(ctx, pod, st, now, w.rejectedStatus(pod, st), "rejected"); !due.IsZero() {
				return due
			}
		}
		if st.stopAt.IsZero() {
			st.stopAt = now.Add(stopDelay(pod, st.running && !st.restarting))
		}
		if now.Before(st.stopAt) {
			return st.stopAt
		}
		if now.Before(st.retryAt) && st.deleteFailed {
			return st.retryAt
		}
		w.s.setInactive(pod.UID)
		st.deleting = true
		zero := int64(0)
		err := w.s.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero,
			Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			klog.ErrorS(err, "Deleting stopped pod, will retry", "pod", ref)
			st.deleting, st.deleteFailed = false, true
			st.retryAt = now.Add(retryDelay)
			return st.retryAt
		}
		klog.InfoS("Pod stopped and deleted", "pod", ref)
		return time.Time{}
	}

	if now.Before(st.retryAt) {
		return st.retryAt
	}
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		w.s.setInactive(pod.UID)
		st.done = true
		return time.Time{}
	}
	if st.done {
		return time.Time{}
	}

	if !st.admitted && st.rejected == nil {
		switch pod.Status.Phase {
		case v1.PodRunning:
			w.admit(ctx, pod, st, now)
			if st.admitted {
				w.adopt(pod, st, now)
			}
		case v1.PodPending, "":
			w.admit(ctx, pod, st, now)
		default:
			return time.Time{}
		}
	}

	if st.rejected != nil {
		return w.write(ctx, pod, st, now, w.rejectedStatus(pod, st), "rejected")
	}
	if st.restarting && now.Before(st.startAt) {
		return st.startAt // back-off: the containers are created again at startAt
	}
	if !st.prepared {
		if err := w.prepare(ctx, pod, st, st.restarting); err != nil {
			klog.ErrorS(err, "Creating container failed, will retry", "pod", ref)
			if msg := err.Error(); msg != st.configErr {
				w.s.recorder.Eventf(pod, v1.EventTypeWarning, "Failed", "Error: %v", err)
				if due := w.write(ctx, pod, st, now, w.configErrorStatus(pod, st, err), "CreateContainerConfigError"); !due.IsZero() {
					return due
				}
				st.configErr = msg
			}
			st.retryAt = now.Add(configRetryDelay)
			return st.retryAt
		}
	}
	if st.record != "" {
		if err := w.writeRecord(ctx, pod, st.record); err != nil {
			klog.ErrorS(err, "Recording allocation on pod, will retry", "pod", ref)
			st.retryAt = now.Add(retryDelay)
			return st.retryAt
		}
		st.record = ""
	}
	if !st.running {
		if now.Before(st.startAt) {
			return st.startAt
		}
		what := "running"
		if st.restarting {
			st.restarts++
			what = "containers restarted"
		}
		if due := w.write(ctx, pod, st, now, w.runningStatus(pod, st, now), what); !due.IsZero() {
			if st.restarting {
				st.restarts--
			}
			return due
		}
		st.running = true
		st.restarting = false
		st.runningAt = now
		d, ok, err := runDuration(pod)
		if err != nil {
			klog.ErrorS(err, "Ignoring run time; pod runs until deleted", "pod", ref)
		}
		if ok {
			st.finishAt = now.Add(d)
		}
	}
	if st.healthSeen {
		st.healthSeen = false
		if due := w.write(ctx, pod, st, now, w.runningStatus(pod, st, st.runningAt), "device health"); !due.IsZero() {
			st.healthSeen = true
			return due
		}
	}
	if !st.finishAt.IsZero() {
		if now.Before(st.finishAt) {
			return st.finishAt
		}
		if restartsExited(pod) {
			return w.restart(ctx, pod, st, now)
		}
		if !st.succeed {
			st.succeed = true
			w.s.setInactive(pod.UID)
		}
		return w.write(ctx, pod, st, now, w.succeededStatus(pod, st, now), "succeeded")
	}
	return time.Time{}
}

// admit runs kubelet's resource allocation admission: the topology manager's Admit, which calls
// the device manager's Allocate for each init container, then each container.
func (w *podWorker) admit(ctx context.Context, pod *v1.Pod, st *podState, now time.Time) {
	w.s.setReceived(pod.UID) // kubelet's podManager.AddPod, just before admission
	attrs := &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: w.otherPods(pod), Operation: lifecycle.AddOperation}
	result := w.s.tm.Admit(ctx, attrs)
	if result.Admit {
		// kubelet's next admit handler: the general predicates (resources fit included) against
		// the Node as its informer last saw it, the allocatable raised to what the device
		// manager already holds for pods (UpdatePluginResources)
		result = w.s.predicates.Admit(ctx, attrs)
	}
	if reason, ok := pod.Annotations[rejectAfterAllocateAnnotation]; ok && result.Admit {
		// a later admit handler rejects the pod; its devices were allocated (and checkpointed)
		// and are freed once the device manager sees the pod inactive
		result = lifecycle.PodAdmitResult{
			Admit:   false,
			Reason:  rejectReason(reason),
			Message: "a later admit handler rejected the pod after its devices were allocated (" + rejectAfterAllocateAnnotation + ")",
		}
	}
	if !result.Admit {
		w.s.setInactive(pod.UID)
		st.rejected = &result
		klog.InfoS("Pod admission failed", "pod", klog.KObj(pod), "reason", result.Reason, "message", result.Message)
		w.s.recorder.Eventf(pod, v1.EventTypeWarning, result.Reason, "%s", result.Message)
		return
	}
	st.admitted = true
	st.startAt = now.Add(w.s.cfg.startDelay)
}

// rejectReason is the reason a rejection after Allocate reports: the annotation's value, or
// "NodeAffinity" (what kubelet's predicate handler reports for a node affinity mismatch) when empty.
func rejectReason(value string) string {
	if value == "" {
		return "NodeAffinity"
	}
	return value
}

// restart is kubelet restarting the app containers that exited (restartPolicy Always): the
// first restart at once, later ones after kubelet's back-off (10 s, doubling, at most 5 min:
// doBackOff, pkg/kubelet/kuberuntime/kuberuntime_manager.go, v1.31.9 line 1423, v1.37.2 line
// 2077; in pkg/kubelet/kubelet.go, backOffPeriod and MaxContainerBackOff at v1.31.9, lines 193,
// 147 and 876, initialCrashLoopBackOff and MaxCrashLoopBackOff at v1.37.2, lines 173, 166 and
// 1087), shown as CrashLoopBackOff meanwhile. Each restart creates the containers again, so
// their run options are fetched again (prepare), which re-Allocates a container the device
// manager has no devices for.
func (w *podWorker) restart(ctx context.Context, pod *v1.Pod, st *podState, now time.Time) time.Time {
	delay := restartDelay(st.restarts)
	if delay > 0 {
		if due := w.write(ctx, pod, st, now, w.backOffStatus(pod, st, delay), "back-off restarting containers"); !due.IsZero() {
			return due
		}
	}
	st.exitedAt = st.finishAt
	st.finishAt = time.Time{}
	st.running = false
	st.restarting = true
	st.prepared = false
	st.configErr = ""
	st.startAt = st.exitedAt.Add(delay)
	klog.InfoS("Containers exited; restarting them", "pod", klog.KObj(pod), "restarts", st.restarts, "after", delay)
	return now
}

// restartDelay is kubelet's back-off before restart number n+1 of a container.
func restartDelay(n int32) time.Duration {
	if n <= 0 {
		return 0
	}
	d := 10 * time.Second
	for i := int32(1); i < n && d < 5*time.Minute; i++ {
		d *= 2
	}
	return min(d, 5*time.Minute)
}

// restartsExited says whether kubelet restarts an app container that exited with code 0: only
// with restartPolicy Always (the default).
func restartsExited(pod *v1.Pod) bool {
	return pod.Spec.RestartPolicy == v1.RestartPolicyAlways || pod.Spec.RestartPolicy == ""
}

// stopDelay is how long kubelet takes to stop a pod being deleted: its running containers'
// preStop sleep hooks, run at once for every container and each bounded by the grace period
// (the deletion's, else the pod's; none at grace 0), as kubelet's killContainer runs them
// (pkg/kubelet/kuberuntime/kuberuntime_container.go, v1.31.9 line 792, v1.37.2 line 896; one
// goroutine per container, v1.31.9 line 843, v1.37.2 line 947). The simulated runtime stops a
// container at once, as the fake CRI runtime does; other hooks take no time.
func stopDelay(pod *v1.Pod, running bool) time.Duration {
	if !running {
		return 0
	}
	grace := int64(v1.DefaultTerminationGracePeriodSeconds)
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = *pod.Spec.TerminationGracePeriodSeconds
	}
	if pod.DeletionGracePeriodSeconds != nil {
		grace = *pod.DeletionGracePeriodSeconds
	}
	var longest int64
	containers := append([]v1.Container{}, pod.Spec.Containers...)
	for _, c := range pod.Spec.InitContainers {
		if podutil.IsRestartableInitContainer(&c) {
			containers = append(containers, c)
		}
	}
	for _, c := range containers {
		if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
			continue
		}
		longest = max(longest, min(c.Lifecycle.PreStop.Sleep.Seconds, grace))
	}
	if grace <= 0 {
		return 0
	}
	return time.Duration(longest) * time.Second
}

// backOffStatus: the app containers waiting in CrashLoopBackOff after they exited.
func (w *podWorker) backOffStatus(pod *v1.Pod, st *podState, delay time.Duration) v1.PodStatus {
	s := w.runningStatus(pod, st, st.runningAt)
	no := false
	for i := range s.ContainerStatuses {
		cs := &s.ContainerStatuses[i]
		cs.LastTerminationState = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
			ExitCode: 0, Reason: "Completed", StartedAt: metav1.NewTime(st.runningAt), FinishedAt: metav1.NewTime(st.finishAt), ContainerID: cs.ContainerID}}
		cs.State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", delay, cs.Name, pod.Name, pod.Namespace, pod.UID)}}
		cs.Ready, cs.Started = false, &no
	}
	s.Conditions = kubeletConditions(pod, &w.base(pod, st).Status, s)
	return s
}

// prepare asks the device manager for each container's run options, as kubelet does when it
// creates the container (this calls the plugin's PreStartContainer where the plugin asks for
// it, and Allocate again for a container it holds no devices for: needsReAllocate in
// GetDeviceRunContainerOptions, pkg/kubelet/cm/devicemanager/manager.go, v1.31.9 line 963,
// v1.37.2 line 1004), and builds the allocation record. appOnly: only the app containers are
// created (a restart; init containers that completed are not run again). On an error kubelet
// reports CreateContainerConfigError and tries again later; so does this.
func (w *podWorker) prepare(ctx context.Context, pod *v1.Pod, st *podState, appOnly bool) error {
	ref := klog.KObj(pod)
	records := map[string]containerRecord{}
	if appOnly {
		for name, rec := range st.records {
			records[name] = rec
		}
	}
	containers := podContainers(pod)
	if appOnly {
		containers = pod.Spec.Containers
	}
	for _, c := range containers {
		opts, err := w.s.dm.GetDeviceRunContainerOptions(ctx, pod, &c)
		if err != nil {
			return &containerError{container: c.Name, err: err}
		}
		rec, ok := buildContainerRecord(w.s.cfg.resourceName, w.s.dm.GetDevices(string(pod.UID), c.Name), opts)
		if !ok {
			continue
		}
		records[c.Name] = rec
		kv := []any{"pod", ref, "container", c.Name, "resource", w.s.cfg.resourceName, "deviceIDs", strings.Join(rec.DeviceIDs, ",")}
		if len(rec.OtherResources) > 0 {
			kv = append(kv, "otherResources", rec.OtherResources)
		}
		klog.InfoS("Allocated", kv...)
	}
	st.prepared = true
	st.records = records
	if len(records) == 0 {
		klog.InfoS("Admitted (no devices)", "pod", ref)
		return nil
	}
	value, err := encodeAllocated(records)
	if err != nil {
		return err
	}
	st.record = value
	return nil
}

// containerError is a container whose creation failed before the runtime was called.
type containerError struct {
	container string
	err       error
}

func (e *containerError) Error() string { return "container " + e.container + ": " + e.err.Error() }
func (e *containerError) Unwrap() error { return e.err }

// configErrorStatus is the status kubelet shows when container creation fails before the
// runtime is called: the containers waiting in CreateContainerConfigError with the error as
// kubelet words it (the device manager's, without the container's name). A pod whose
// containers ran before (a restart) stays Running, its containers not ready, their last run
// terminated.
func (w *podWorker) configErrorStatus(pod *v1.Pod, st *podState, err error) v1.PodStatus {
	s := *w.base(pod, st).Status.DeepCopy()
	msg := err.Error()
	if ce, ok := err.(*containerError); ok {
		msg = ce.err.Error()
	}
	s.ContainerStatuses = nil
	no := false
	for _, c := range pod.Spec.Containers {
		cs := v1.ContainerStatus{
			Name: c.Name, Image: c.Image, RestartCount: st.restarts, Started: &no,
			State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: msg}},
		}
		if st.restarting {
			cs.LastTerminationState = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
				ExitCode: 0, Reason: "Completed", StartedAt: metav1.NewTime(st.runningAt), FinishedAt: metav1.NewTime(st.exitedAt), ContainerID: containerID(pod, c.Name)}}
		}
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
	}
	s.Conditions = kubeletConditions(pod, &w.base(pod, st).Status, s)
	return s
}

// adopt takes over a pod that was already running when this kubelet started, once admission
// (admitArrivals) admitted it again: its containers keep running, so nothing is created and no
// run options are fetched. Its devices are those of the device manager's checkpoint; without
// one, the device manager allocated nothing to its running containers (devicesToAllocate,
// pkg/kubelet/cm/devicemanager/manager.go, v1.31.9 line 598, v1.37.2 line 632) until they are
// created again.
func (w *podWorker) adopt(pod *v1.Pod, st *podState, now time.Time) {
	st.admitted = true
	st.prepared = true
	if raw, ok := pod.Annotations[allocatedAnnotation]; ok {
		var records map[string]containerRecord
		if err := json.Unmarshal([]byte(raw), &records); err == nil {
			st.records = records
		}
	}
	st.running = true
	st.runningAt = now
	for _, cs := range pod.Status.ContainerStatuses {
		st.restarts = max(st.restarts, cs.RestartCount)
	}
	if pod.Status.StartTime != nil {
		st.runningAt = pod.Status.StartTime.Time
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Running != nil && cs.State.Running.StartedAt.After(st.runningAt) {
			st.runningAt = cs.State.Running.StartedAt.Time
		}
	}
	d, ok, err := runDuration(pod)
	if err != nil {
		klog.ErrorS(err, "Ignoring run time; pod runs until deleted", "pod", klog.KObj(pod))
	}
	if ok {
		st.finishAt = st.runningAt.Add(d)
	}
	klog.InfoS("Pod already running: admitted again, its containers kept", "pod", klog.KObj(pod))
}

func (w *podWorker) otherPods(pod *v1.Pod) []*v1.Pod {
	var out []*v1.Pod
	for _, p := range w.s.activePods() {
		if p.UID != pod.UID {
			out = append(out, p)
		}
	}
	return out
}

// writeRecord patches allocatedAnnotation onto the pod (metadata only; the UID in the patch is
// a precondition).
func (w *podWorker) writeRecord(ctx context.Context, pod *v1.Pod, value string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         pod.UID,
		"annotations": map[string]string{allocatedAnnotation: value},
	}})
	if err != nil {
		return err
	}
	_, err = w.s.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// write patches the pod status with kubelet's status patch (UID precondition). It returns zero
// on success, else when to retry.
func (w *podWorker) write(ctx context.Context, pod *v1.Pod, st *podState, now time.Time, newStatus v1.PodStatus, what string) time.Time {
	old := w.base(pod, st)
	updated, _, unchanged, err := statusutil.PatchPodStatus(ctx, w.s.client, pod.Namespace, pod.Name, pod.UID, old.Status, newStatus)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return time.Time{}
		}
		klog.ErrorS(err, "Pod status update failed, will retry", "pod", klog.KObj(pod), "status", what)
		st.retryAt = now.Add(retryDelay)
		return st.retryAt
	}
	if !unchanged {
		if st.staleRVs == nil {
			st.staleRVs = sets.New[string]()
		}
		st.staleRVs.Insert(old.ResourceVersion)
		st.last = updated
	}
	switch newStatus.Phase {
	case v1.PodFailed, v1.PodSucceeded:
		st.done = true
	}
	if what == "device health" {
		klog.V(2).InfoS("Pod device health written", "pod", klog.KObj(pod))
	} else {
		klog.InfoS("Pod "+what, "pod", klog.KObj(pod))
	}
	return time.Time{}
}

// base is the newest copy of the pod we know: our last write's result or the informer's.
func (w *podWorker) base(pod *v1.Pod, st *podState) *v1.Pod {
	if st.last != nil && st.staleRVs.Has(pod.ResourceVersion) {
		return st.last
	}
	return pod
}

// rejectedStatus is kubelet's rejectPod status.
func (w *podWorker) rejectedStatus(pod *v1.Pod, st *podState) v1.PodStatus {
	s := *w.base(pod, st).Status.DeepCopy()
	s.Phase = v1.PodFailed
	s.Reason = st.rejected.Reason
	s.Message = "Pod was rejected: " + st.rejected.Message
	return s
}

func containerID(pod *v1.Pod, name string) string {
	return fmt.Sprintf("sim://%s/%s", pod.UID, name)
}

// runningStatus: init containers completed (restartable ones running), containers running and
// ready, kubelet's pod conditions, and the device manager's allocated resource health.
func (w *podWorker) runningStatus(pod *v1.Pod, st *podState, started time.Time) v1.PodStatus {
	base := w.base(pod, st)
	s := *base.Status.DeepCopy()
	startedAt := metav1.NewTime(started)
	s.Phase = v1.PodRunning
	s.Reason, s.Message = "", ""
	if s.StartTime == nil {
		s.StartTime = &startedAt
	}
	yes := true
	s.InitContainerStatuses = nil
	for _, c := range pod.Spec.InitContainers {
		cs := v1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: "sim://" + c.Image, ContainerID: containerID(pod, c.Name)}
		if podutil.IsRestartableInitContainer(&c) {
			cs.State = v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: startedAt}}
			cs.Ready, cs.Started = true, &yes
		} else {
			cs.State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: startedAt, FinishedAt: startedAt, ContainerID: cs.ContainerID}}
			no := false
			cs.Started = &no
		}
		s.InitContainerStatuses = append(s.InitContainerStatuses, cs)
	}
	s.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		cs := v1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "sim://" + c.Image, ContainerID: containerID(pod, c.Name),
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: startedAt}},
			Ready: true, Started: &yes, RestartCount: st.restarts,
		}
		if st.restarts > 0 {
			cs.ContainerID = fmt.Sprintf("%s-%d", cs.ContainerID, st.restarts)
			cs.LastTerminationState = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
				ExitCode: 0, Reason: "Completed", FinishedAt: metav1.NewTime(st.exitedAt), ContainerID: containerID(pod, c.Name)}}
		}
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
	}
	w.s.dm.UpdateAllocatedResourcesStatus(klog.Background(), pod, &s)
	s.Conditions = kubeletConditions(pod, &base.Status, s)
	return s
}

// succeededStatus: every container terminated with exit code 0.
func (w *podWorker) succeededStatus(pod *v1.Pod, st *podState, now time.Time) v1.PodStatus {
	s := w.runningStatus(pod, st, st.runningAt)
	finished := metav1.NewTime(now)
	no := false
	for i := range s.ContainerStatuses {
		cs := &s.ContainerStatuses[i]
		cs.State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
			ExitCode: 0, Reason: "Completed", StartedAt: metav1.NewTime(st.runningAt), FinishedAt: finished, ContainerID: cs.ContainerID}}
		cs.Ready, cs.Started = false, &no
	}
	for i := range s.InitContainerStatuses {
		cs := &s.InitContainerStatuses[i]
		if cs.State.Running != nil {
			cs.State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
				ExitCode: 0, Reason: "Completed", StartedAt: metav1.NewTime(st.runningAt), FinishedAt: finished, ContainerID: cs.ContainerID}}
			cs.Ready, cs.Started = false, &no
		}
	}
	s.Phase = v1.PodSucceeded
	s.Conditions = kubeletConditions(pod, &w.base(pod, st).Status, s)
	return s
}

// kubeletConditions replaces the kubelet-owned pod conditions with kubelet's generators' output,
// keeping others (PodScheduled, DisruptionTarget, readiness gates) and transition times that did
// not change.
func kubeletConditions(pod *v1.Pod, old *v1.PodStatus, s v1.PodStatus) []v1.PodCondition {
	now := metav1.Now()
	phase := s.Phase
	all := append(append([]v1.ContainerStatus{}, s.InitContainerStatuses...), s.ContainerStatuses...)
	readyToStart := v1.PodCondition{Type: v1.PodReadyToStartContainers, Status: v1.ConditionTrue}
	if phase == v1.PodSucceeded || phase == v1.PodFailed {
		readyToStart.Status = v1.ConditionFalse
	}
	owned := []v1.PodCondition{
		readyToStart,
		status.GeneratePodInitializedCondition(pod, old, all, phase),
		status.GenerateContainersReadyCondition(pod, old, all, phase),
		status.GeneratePodReadyCondition(pod, old, s.Conditions, all, phase),
	}
	conds := make([]v1.PodCondition, 0, len(s.Conditions)+len(owned))
	isOwned := map[v1.PodConditionType]bool{}
	for _, c := range owned {
		isOwned[c.Type] = true
	}
	for _, c := range s.Conditions {
		if !isOwned[c.Type] {
			conds = append(conds, c)
		}
	}
	for _, c := range owned {
		c.LastTransitionTime = now
		if _, prev := podutil.GetPodConditionFromList(old.Conditions, c.Type); prev != nil && prev.Status == c.Status && !prev.LastTransitionTime.IsZero() {
			c.LastTransitionTime = prev.LastTransitionTime
		}
		conds = append(conds, c)
	}
	return conds
}
