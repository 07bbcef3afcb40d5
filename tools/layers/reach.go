package main

import (
	"fmt"
	"go/types"
	"maps"
	"slices"
	"strings"

	"golang.org/x/tools/go/callgraph"
	"golang.org/x/tools/go/callgraph/static"
)

// reportReach prints, for each of the operations named (all when none
// is), the functions of the core it reaches in the static call graph.
func reportReach(p *program, names []string) error {
	ops := operations(p.root.Types)
	if len(names) == 0 {
		names = slices.SortedFunc(maps.Keys(ops), byType)
	}
	for _, name := range names {
		if ops[name] == nil {
			return fmt.Errorf("no operation %s; there are %s", name, strings.Join(slices.SortedFunc(maps.Keys(ops), byType), ", "))
		}
	}
	cg := static.CallGraph(p.ssa)
	fmt.Println()
	fmt.Println("## Static reach (static call graph: distinct declared functions and methods of the core; closures and wrappers not counted)")
	fmt.Println()
	fmt.Println("| operation | root | internal | total | internal packages reached |")
	fmt.Println("|---|--:|--:|--:|---|")
	for _, name := range names {
		start := cg.Nodes[p.ssa.FuncValue(ops[name])]
		if start == nil {
			return fmt.Errorf("%s: not in the call graph", name)
		}
		root, internal := 0, 0
		pkgs := map[string]bool{}
		for fn := range p.reach(start) {
			if fn.Pkg() == p.root.Types {
				root++
			} else {
				internal++
				pkgs[strings.TrimPrefix(fn.Pkg().Path(), p.root.Types.Path()+"/internal/")] = true
			}
		}
		fmt.Printf("| %s | %d | %d | %d | %s |\n", name, root, internal, root+internal, strings.Join(slices.Sorted(maps.Keys(pkgs)), ", "))
	}
	return nil
}

// byType orders the names of operations: the Limiter's methods, then the
// Slot's, each sorted.
func byType(a, b string) int {
	if sa, sb := strings.Contains(a, "."), strings.Contains(b, "."); sa != sb {
		if sa {
			return 1
		}
		return -1
	}
	return strings.Compare(a, b)
}

// operations returns the exported methods of *Limiter, by name, and those
// of Slot, by Slot.name, declared in pkg.
func operations(pkg *types.Package) map[string]*types.Func {
	ops := map[string]*types.Func{}
	for _, typ := range []string{"Limiter", "Slot"} {
		tn, ok := pkg.Scope().Lookup(typ).(*types.TypeName)
		if !ok {
			continue
		}
		prefix := typ + "."
		if typ == "Limiter" {
			prefix = ""
		}
		ms := types.NewMethodSet(types.NewPointer(tn.Type()))
		for sel := range ms.Methods() {
			if len(sel.Index()) == 1 && sel.Obj().Exported() {
				ops[prefix+sel.Obj().Name()] = sel.Obj().(*types.Func)
			}
		}
	}
	return ops
}

// reach returns the declared functions and methods of the core (of a
// generic one, the generic function, not its instances) of start and of
// the nodes reachable from it, closures left out.
func (p *program) reach(start *callgraph.Node) map[*types.Func]bool {
	funcs := map[*types.Func]bool{}
	seen := map[*callgraph.Node]bool{start: true}
	for queue := []*callgraph.Node{start}; len(queue) > 0; queue = queue[1:] {
		n := queue[0]
		if obj, ok := n.Func.Object().(*types.Func); ok && n.Func.Parent() == nil && obj.Pkg() != nil && p.core[obj.Pkg().Path()] {
			funcs[obj.Origin()] = true
		}
		for _, e := range n.Out {
			if !seen[e.Callee] {
				seen[e.Callee] = true
				queue = append(queue, e.Callee)
			}
		}
	}
	return funcs
}
