// Command gen writes the extender protocol fixtures of tests/unit/test_extender_protocol.py:
// the exact JSON kube-scheduler v1.37 sends (pkg/scheduler/extender.go marshals these Go types
// with encoding/json) and the JSON of the answers it decodes.  Regenerate with
// tests/unit/extender_wire/regenerate.sh; the output is committed so tests need no Go.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

const gpu = v1.ResourceName("nvidia.com/gpu")

func gpus(n int64) v1.ResourceList {
	return v1.ResourceList{gpu: *resource.NewQuantity(n, resource.DecimalSI), v1.ResourceCPU: resource.MustParse("100m")}
}

func pod() *v1.Pod {
	always := v1.ContainerRestartPolicyAlways
	return &v1.Pod{
		TypeMeta: metav1.TypeMeta{},
		ObjectMeta: metav1.ObjectMeta{
			Name: "train-0", Namespace: "ml", UID: types.UID("5f0c1c5e-8a4e-4f57-9d0a-6c1d2b3a4e5f"),
			ResourceVersion: "4711", CreationTimestamp: metav1.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC),
			Labels: map[string]string{"app": "train"},
		},
		Spec: v1.PodSpec{
			InitContainers: []v1.Container{
				{Name: "fetch", Image: "busybox", Resources: v1.ResourceRequirements{Limits: gpus(1), Requests: gpus(1)}},
				{Name: "monitor", Image: "busybox", RestartPolicy: &always},
			},
			Containers: []v1.Container{
				{Name: "train", Image: "pytorch", Resources: v1.ResourceRequirements{Limits: gpus(2), Requests: gpus(2)}},
				{Name: "log", Image: "busybox"},
			},
			SchedulerName: "default-scheduler",
		},
		Status: v1.PodStatus{Phase: v1.PodPending, QOSClass: v1.PodQOSBurstable},
	}
}

func node(name string, inventory string, n int64) v1.Node {
	return v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, ResourceVersion: "100", Labels: map[string]string{"kubernetes.io/hostname": name},
			Annotations: map[string]string{"nodelock.io/gpus": inventory},
		},
		Status: v1.NodeStatus{
			Capacity:    v1.ResourceList{gpu: *resource.NewQuantity(n, resource.DecimalSI), v1.ResourceCPU: resource.MustParse("64")},
			Allocatable: v1.ResourceList{gpu: *resource.NewQuantity(n, resource.DecimalSI), v1.ResourceCPU: resource.MustParse("63")},
			Conditions:  []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
		},
	}
}

func inv(prefix string, n int) string {
	s := "["
	for i := 0; i < n; i++ {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(`{"id":"%s-%d","index":%d,"model":"NVIDIA H100 80GB HBM3","memoryMiB":81559,"numa":%d,"healthy":true}`, prefix, i, i, i/4)
	}
	return s + "]"
}

func write(dir, name string, v interface{}) {
	out, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), append(out, '\n'), 0o644); err != nil {
		panic(err)
	}
}

func main() {
	dir := os.Args[1]
	names := []string{"gpu-a", "gpu-b", "cpu-only"}
	// nodeCacheCapable: true — extender.go sets NodeNames, leaves Nodes nil
	write(dir, "args_node_cache.json", &extenderv1.ExtenderArgs{Pod: pod(), NodeNames: &names})
	// nodeCacheCapable: false — extender.go sets Nodes (a NodeList of the candidates)
	list := &v1.NodeList{Items: []v1.Node{node("gpu-a", inv("GPU-a", 8), 8), node("gpu-b", inv("GPU-b", 2), 2), node("cpu-only", "", 0)}}
	delete(list.Items[2].Annotations, "nodelock.io/gpus")
	write(dir, "args_node_list.json", &extenderv1.ExtenderArgs{Pod: pod(), Nodes: list})
	// bind: ExtenderBindingArgs from the v1.Binding the scheduler builds
	write(dir, "bind_args.json", &extenderv1.ExtenderBindingArgs{
		PodName: "train-0", PodNamespace: "ml", PodUID: types.UID("5f0c1c5e-8a4e-4f57-9d0a-6c1d2b3a4e5f"), Node: "gpu-a",
	})
	// the answers, as Go marshals them: our output must have the same field names and JSON types
	kept := []string{"gpu-a"}
	write(dir, "filter_result_node_cache.json", &extenderv1.ExtenderFilterResult{
		NodeNames:                  &kept,
		FailedNodes:                extenderv1.FailedNodesMap{"gpu-b": "x"},
		FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{"cpu-only": "y"},
	})
	write(dir, "filter_result_node_list.json", &extenderv1.ExtenderFilterResult{
		Nodes:                      &v1.NodeList{Items: []v1.Node{list.Items[0]}},
		FailedNodes:                extenderv1.FailedNodesMap{"gpu-b": "x"},
		FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{"cpu-only": "y"},
	})
	write(dir, "host_priority_list.json", &extenderv1.HostPriorityList{{Host: "gpu-a", Score: 10}, {Host: "gpu-b", Score: 0}})
	write(dir, "bind_result.json", &extenderv1.ExtenderBindingResult{Error: "x"})
}
