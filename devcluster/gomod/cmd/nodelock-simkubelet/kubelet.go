package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	kubeletutil "k8s.io/kubernetes/pkg/kubelet/util"
	"k8s.io/utils/clock"
)

// devicePluginSocket is kubelet's fixed registration socket (pluginapi.KubeletSocket).
const devicePluginSocket = pluginapi.KubeletSocket

// simKubelet is one simulated node.
type simKubelet struct {
	cfg      config
	client   kubernetes.Interface
	recorder record.EventRecorder
	events   record.EventBroadcaster

	// kubelet's own managers, unmodified.
	tm topologymanager.Manager
	dm *devicemanager.ManagerImpl

	factory     informers.SharedInformerFactory
	podLister   corelisters.PodLister
	podsSynced  cache.InformerSynced
	nodeFactory informers.SharedInformerFactory
	nodeLister  corelisters.NodeLister
	predicates  lifecycle.PodAdmitHandler
	nodesSynced cache.InformerSynced

	node *nodeStatusManager
	pods *podWorker

	wake chan struct{}

	// inactive holds pods this kubelet has finished with (rejected, succeeded or stopped for
	// deletion) before the informer shows it; activePods leaves them out so the device manager
	// frees their devices, as kubelet's pod workers do.
	mu       sync.Mutex
	inactive sets.Set[types.UID]
	// received holds pods admission has reached. kubelet adds a pod to its pod manager just
	// before admitting it, one pod at a time, so the pod manager (what the PodResources List
	// reports) never holds a pod that waits behind the one being admitted.
	received sets.Set[types.UID]
	// arrival is the batch each pod arrived in, as kubelet's config source delivers them: 0 for
	// the pods of the first listing, then one batch per later pod (kubelet's apiserver source
	// sends its whole pod list on every watch event, pkg/kubelet/config/apiserver.go, v1.31.9
	// line 64, v1.37.2 line 63, and the merge turns each into an ADD of the pods new in it,
	// pkg/kubelet/config/config.go, v1.31.9 line 312, v1.37.2 line 245). Admission takes batches
	// in arrival order.
	arrival     map[types.UID]uint64
	lastArrival uint64
	// sourcesSeen is kubelet's sourcesReady: false until the first batch of pods was handled
	// (syncLoopIteration calls sourcesReady.AddSource after HandlePodAdditions,
	// pkg/kubelet/kubelet.go, v1.31.9 lines 2412, 2433, v1.37.2 lines 2765, 2783). While false,
	// the device manager allocates nothing to a container the runtime reports running
	// (devicesToAllocate).
	sourcesSeen atomic.Bool
}

func newSimKubelet(ctx context.Context, cfg config, restCfg *rest.Config) (*simKubelet, error) {
	logger := klog.FromContext(ctx)
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	// As in kubelet's container manager: a topology manager (--topology-manager-policy, container
	// scope) with the device manager as its hint provider, both given the machine's NUMA nodes;
	// its Admit is kubelet's resource allocation admit handler, which calls the device manager's
	// Allocate per container.
	topology := numaTopology(cfg.numaNodes)
	tm, err := topologymanager.NewManager(logger, topology, cfg.topologyPolicy, topologymanager.ContainerTopologyScope, nil)
	if err != nil {
		return nil, fmt.Errorf("topology manager: %w", err)
	}
	dm, err := devicemanager.NewManagerImpl(logger, topology, tm)
	if err != nil {
		return nil, fmt.Errorf("device manager: %w", err)
	}
	tm.AddHintProvider(logger, dm)

	s := &simKubelet{
		cfg:      cfg,
		client:   client,
		tm:       tm,
		dm:       dm,
		wake:     make(chan struct{}, 1),
		inactive: sets.New[types.UID](),
		received: sets.New[types.UID](),
		arrival:  map[types.UID]uint64{},
	}
	s.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.nodeName).String()
	}))
	podInformer := s.factory.Core().V1().Pods()
	s.podLister = podInformer.Lister()
	s.podsSynced = podInformer.Informer().HasSynced
	if _, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if pod, ok := obj.(*v1.Pod); ok {
				s.arrived(pod.UID, initial)
			}
			s.kick()
		},
		UpdateFunc: func(any, any) { s.kick() },
		DeleteFunc: func(any) { s.kick() },
	}); err != nil {
		return nil, err
	}
	s.nodeFactory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.nodeName).String()
	}))
	nodeInformer := s.nodeFactory.Core().V1().Nodes()
	s.nodeLister = nodeInformer.Lister()
	s.nodesSynced = nodeInformer.Informer().HasSynced

	s.events = record.NewBroadcaster(record.WithContext(ctx))
	// kubelet's admit handlers after resource allocation: the predicate handler, with the Node
	// from the informer and the device manager's UpdatePluginResources (kubelet.go: v1.31.9
	// line 905, v1.37.2 line 1137, both right after GetAllocateResourcesPodAdmitHandler)
	s.predicates = lifecycle.NewPredicateAdmitHandler(s.cachedNode, passFailures{}, dm.UpdatePluginResources)
	s.recorder = s.events.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: cfg.nodeName})
	s.node = newNodeStatusManager(client, cfg, dm, s.nodeLister)
	s.pods = newPodWorker(s)
	return s, nil
}

// numaTopology is cadvisor's machine topology with NUMA nodes 0..n-1 (nil for n == 0), as kubelet
// passes it to its topology and device managers; only the node IDs are read there.
func numaTopology(n int) []cadvisorapi.Node {
	if n == 0 {
		return nil
	}
	out := make([]cadvisorapi.Node, n)
	for i := range out {
		out[i].Id = i
	}
	return out
}

// run starts everything and blocks until ctx ends; then it stops the device manager (closing
// the registration socket) and returns.
func (s *simKubelet) run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	s.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.client.CoreV1().Events("")})
	defer s.events.Shutdown()

	s.factory.Start(ctx.Done())
	s.nodeFactory.Start(ctx.Done())
	defer s.factory.Shutdown()
	defer s.nodeFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), s.podsSynced, s.nodesSynced) {
		return ctx.Err()
	}
	if err := s.node.register(ctx); err != nil {
		return err
	}

	// Like kubelet: the checkpoint is read, every other socket in the directory is removed
	// (plugins must register again) and the registration server starts on kubelet.sock. The
	// containers the runtime reports are those the API shows running (kubelet builds them from
	// its runtime: buildContainerMapAndRunningSetFromRuntime, pkg/kubelet/cm/helpers.go, v1.31.9
	// line 55, v1.37.2 line 68).
	sourcesReady := kubeletconfig.NewSourcesReady(func(sets.Set[string]) bool { return s.sourcesSeen.Load() })
	pods, err := s.podLister.List(everything)
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	containers, running := runningContainers(pods, time.Now())
	if err := s.dm.Start(logger, s.activePods, sourcesReady, containers, running); err != nil {
		return fmt.Errorf("start device manager: %w", err)
	}
	klog.InfoS("Device plugin registration server listening", "node", s.cfg.nodeName, "socket", devicePluginSocket)
	defer func() {
		if err := s.dm.Stop(logger); err != nil {
			klog.ErrorS(err, "Stopping device manager")
		}
	}()
	// Like kubelet: the PodResources API answers from the device manager's own records.
	if s.cfg.podResourcesSocket != "" {
		stopPodResources, err := servePodResources(ctx, s.cfg.podResourcesSocket, s.podResourcesProviders())
		if err != nil {
			return err
		}
		defer stopPodResources()
		klog.InfoS("Serving the PodResources API", "node", s.cfg.nodeName, "socket", s.cfg.podResourcesSocket)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	leaseCtl := lease.NewController(clock.RealClock{}, s.client, s.cfg.nodeName, int32(s.cfg.leaseDurationS), nil,
		s.cfg.heartbeat, s.cfg.nodeName, v1.NamespaceNodeLease, kubeletutil.SetNodeOwnerFunc(ctx, s.client, s.cfg.nodeName))
	wg.Add(2)
	go func() { defer wg.Done(); leaseCtl.Run(ctx) }()
	go func() { defer wg.Done(); s.node.run(ctx) }()

	s.pods.loop(ctx)
	return nil
}

// arrived records the admission batch of a pod the informer added (initial: part of its first
// listing).
func (s *simKubelet) arrived(uid types.UID, initial bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, seen := s.arrival[uid]; seen {
		return
	}
	if initial {
		s.arrival[uid] = 0
		return
	}
	s.lastArrival++
	s.arrival[uid] = s.lastArrival
}

// arrivalOf is the batch a pod arrived in (0 for one not recorded: the first listing).
func (s *simKubelet) arrivalOf(uid types.UID) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arrival[uid]
}

// runningContainers is what kubelet's container manager gives the device manager at start from
// the runtime: every container of the pods with its ID, and the IDs of those running. The
// simulated runtime's containers are the ones the pods' statuses show; an app container whose
// run time (runSecondsAnnotation) ended by now exited while no kubelet ran, as the runtime would
// report it, so it is not running.
func runningContainers(pods []*v1.Pod, now time.Time) (containermap.ContainerMap, sets.Set[string]) {
	cm := containermap.NewContainerMap()
	running := sets.New[string]()
	for _, pod := range pods {
		statuses := append(append([]v1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...)
		for _, cs := range statuses {
			if cs.ContainerID == "" {
				continue
			}
			cm.Add(string(pod.UID), cs.Name, cs.ContainerID)
			if cs.State.Running != nil && !exitedBy(pod, cs, now) {
				running.Insert(cs.ContainerID)
			}
		}
	}
	return cm, running
}

// exitedBy says whether an app container shown running has reached the end of its run time.
func exitedBy(pod *v1.Pod, cs v1.ContainerStatus, now time.Time) bool {
	app := false
	for _, c := range pod.Spec.Containers {
		app = app || c.Name == cs.Name
	}
	d, ok, err := runDuration(pod)
	if !app || !ok || err != nil {
		return false
	}
	return !now.Before(cs.State.Running.StartedAt.Add(d))
}

// kick wakes the pod loop.
func (s *simKubelet) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *simKubelet) setInactive(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inactive.Insert(uid)
}

func (s *simKubelet) forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inactive.Delete(uid)
	s.received.Delete(uid)
	delete(s.arrival, uid)
}

// setReceived marks a pod as in kubelet's pod manager (called as its admission starts).
func (s *simKubelet) setReceived(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.received.Insert(uid)
}

// managedPods is kubelet's GetActivePods as the PodResources server sees it: the active pods
// (activePods) that admission has reached. A pod that arrived but waits for the one being
// admitted is not in kubelet's pod manager yet, so it is left out.
func (s *simKubelet) managedPods() []*v1.Pod {
	active := s.activePods()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*v1.Pod, 0, len(active))
	for _, p := range active {
		if s.received.Has(p.UID) {
			out = append(out, p)
		}
	}
	return out
}

// podManagerPods is kubelet's pod manager out of pods (the informer's): those admission has
// reached, and those that arrived in a terminal phase (added, never admitted).
func (s *simKubelet) podManagerPods(pods []*v1.Pod) []*v1.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*v1.Pod, 0, len(pods))
	for _, p := range pods {
		if s.received.Has(p.UID) || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			out = append(out, p)
		}
	}
	return out
}

// activePods is the device manager's ActivePodsFunc: the pods bound to this node that are not
// in a terminal phase and that this kubelet has not finished with. Devices of pods outside this
// list are freed by the device manager on its next allocation.
func (s *simKubelet) activePods() []*v1.Pod {
	pods, err := s.podLister.List(everything)
	if err != nil {
		klog.ErrorS(err, "Listing pods for the device manager")
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*v1.Pod, 0, len(pods))
	for _, p := range pods {
		if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed || s.inactive.Has(p.UID) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// retryDelay is how long a failed API write waits before the next try.
const retryDelay = time.Second

// cachedNode is kubelet's GetCachedNode: the Node from the informer, or, before the informer has
// it, a Node with the machine's base capacity only (kubelet's initialNode; extended resources a
// Node does not list are not checked at admission).
func (s *simKubelet) cachedNode(context.Context, bool) (*v1.Node, error) {
	if node, err := s.nodeLister.Get(s.cfg.nodeName); err == nil {
		return node, nil
	}
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: s.cfg.nodeName, Labels: s.node.labels},
		Status:     v1.NodeStatus{Capacity: baseCapacity(), Allocatable: baseCapacity()},
	}, nil
}

// passFailures is kubelet's critical pod admission handler for pods that are not critical: the
// predicate failures stand (no preemption).
type passFailures struct{}

func (passFailures) HandleAdmissionFailure(_ context.Context, _ *v1.Pod, reasons []lifecycle.PredicateFailureReason, _ lifecycle.Operation) ([]lifecycle.PredicateFailureReason, error) {
	return reasons, nil
}
