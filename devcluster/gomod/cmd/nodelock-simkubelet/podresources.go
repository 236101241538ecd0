package main

import (
	"context"
	"fmt"
	"os"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	criutil "k8s.io/cri-client/pkg/util"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	podresourcesapiv1alpha1 "k8s.io/kubelet/pkg/apis/podresources/v1alpha1"
	apisgrpc "k8s.io/kubernetes/pkg/kubelet/apis/grpc"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// podResourcesProviders gives kubelet's own PodResources server (k8s.io/kubernetes/pkg/kubelet/
// apis/podresources, unmodified) what kubelet's container manager and pod manager give it:
// pods from this node's informer (active pods as the device manager sees them), devices from
// the device manager. The simulated node has no CPU manager, memory manager or DRA manager, so
// those report nothing, as kubelet's do for containers on the shared pool.
type podResourcesProviders struct {
	s *simKubelet
}

var (
	_ podresources.PodsProvider             = podResourcesProviders{}
	_ podresources.DevicesProvider          = podResourcesProviders{}
	_ podresources.CPUsProvider             = podResourcesProviders{}
	_ podresources.MemoryProvider           = podResourcesProviders{}
	_ podresources.DynamicResourcesProvider = podResourcesProviders{}
)

// GetActivePods is kubelet's active pod list (what List reports with kubelet's default
// KubeletPodResourcesListUseActivePods): the pods in its pod manager, i.e. those admission has
// reached, that are not finished.
func (p podResourcesProviders) GetActivePods() []*v1.Pod { return p.s.managedPods() }

// GetPods is kubelet's pod manager (what List returns before 1.34, or with
// KubeletPodResourcesListUseActivePods off): every pod bound to this node that admission has
// reached, rejected, finished and terminating ones included, until it is deleted from the API.
// kubelet adds a pod to its pod manager before it checks the pod's phase, so a pod that is
// already terminal when it arrives is in it too (kubelet.go HandlePodAdditions).
func (p podResourcesProviders) GetPods() []*v1.Pod {
	pods, err := p.s.podLister.List(everything)
	if err != nil {
		klog.ErrorS(err, "Listing pods for the PodResources server")
		return nil
	}
	return p.s.podManagerPods(pods)
}

// GetPodByName finds an active pod, as kubelet's pods provider does (inactive pods are not found).
func (p podResourcesProviders) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, pod := range p.s.managedPods() {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

// UpdateAllocatedDevices frees the devices of pods that are no longer active (the device manager's own).
func (p podResourcesProviders) UpdateAllocatedDevices(logger klog.Logger) {
	p.s.dm.UpdateAllocatedDevices(logger)
}

// GetDevices is the device manager's record of one container's devices.
func (p podResourcesProviders) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	return containerDevices(p.s.dm.GetDevices(podUID, containerName))
}

// GetAllocatableDevices is every healthy device the device manager knows.
func (p podResourcesProviders) GetAllocatableDevices(logger klog.Logger) []*podresourcesapi.ContainerDevices {
	return containerDevices(p.s.dm.GetAllocatableDevices(logger))
}

func (podResourcesProviders) GetCPUs(*v1.Pod, *v1.Container) []int64 { return []int64{} }
func (podResourcesProviders) GetPodCPUs(string) []int64              { return []int64{} }
func (podResourcesProviders) GetAllocatableCPUs() []int64            { return []int64{} }

func (podResourcesProviders) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.ContainerMemory {
	return []*podresourcesapi.ContainerMemory{}
}

func (podResourcesProviders) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory {
	return []*podresourcesapi.ContainerMemory{}
}

func (podResourcesProviders) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory {
	return []*podresourcesapi.ContainerMemory{}
}

func (podResourcesProviders) GetDynamicResources(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return []*podresourcesapi.DynamicResource{}
}

// containerDevices converts the device manager's records to the API's, exactly as kubelet's
// container manager does (containerDevicesFromResourceDeviceInstances, unexported there): one
// entry per device and NUMA node, without topology when the plugin reported none.
func containerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resourceName, resourceDevs := range devs {
		for devID, dev := range resourceDevs {
			topo := dev.GetTopology()
			if topo == nil {
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resourceName, DeviceIds: []string{devID}})
				continue
			}
			for _, node := range topo.GetNodes() {
				out = append(out, &podresourcesapi.ContainerDevices{
					ResourceName: resourceName,
					DeviceIds:    []string{devID},
					Topology:     &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: node.GetID()}}},
				})
			}
		}
	}
	return out
}

// servePodResources serves kubelet's PodResources API (v1 and v1alpha1, kubelet's own server
// code and rate limit) on the unix socket at path, as kubelet's ListenAndServePodResources does
// on /var/lib/kubelet/pod-resources/kubelet.sock. A stale socket file is replaced. The returned
// stop function stops the server and removes the socket.
func servePodResources(ctx context.Context, path string, providers podresources.PodResourcesProviders) (func(), error) {
	server := grpc.NewServer(apisgrpc.WithRateLimiter(ctx, "podresources", podresources.DefaultQPS, podresources.DefaultBurstTokens))
	podresourcesapiv1alpha1.RegisterPodResourcesListerServer(server, podresources.NewV1alpha1PodResourcesServer(providers))
	podresourcesapi.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx, providers))
	l, err := criutil.CreateListener("unix://" + path)
	if err != nil {
		return nil, fmt.Errorf("PodResources socket %s: %w", path, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := server.Serve(l); err != nil {
			klog.ErrorS(err, "PodResources server stopped")
		}
	}()
	return func() {
		server.Stop()
		<-done
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			klog.ErrorS(err, "Removing the PodResources socket", "path", path)
		}
	}, nil
}

// providers is the PodResources providers of this node.
func (s *simKubelet) podResourcesProviders() podresources.PodResourcesProviders {
	p := podResourcesProviders{s: s}
	return podresources.PodResourcesProviders{Pods: p, Devices: p, Cpus: p, Memory: p, DynamicResources: p}
}
