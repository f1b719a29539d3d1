# simt/switch.S — the emulator's fiber switch (x86-64 System V): saves the callee-saved
# registers, MXCSR and the x87 control word on the current stack, stores the stack pointer in
# *save_sp, loads load_sp and restores the same from there. A new fiber's stack is laid out by
# fiber_prepare (runtime.cpp) so that the first switch "returns" into simt_fiber_entry, which
# calls r13(r12) and never returns.
    .text
    .globl simt_switch
    .type simt_switch, @function
# void simt_switch(void **save_sp, void *load_sp)
simt_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size simt_switch, .-simt_switch

    .globl simt_fiber_entry
    .type simt_fiber_entry, @function
simt_fiber_entry:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size simt_fiber_entry, .-simt_fiber_entry
    .section .note.GNU-stack,"",@progbits
