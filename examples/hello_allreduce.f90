! hello_allreduce.f90 - the smallest gcomm program in Fortran: an MPI code sums a vector across
! ranks with gcomm on host memory, overlapping the reduction with its own work.
!
!   mpiexec -n 4 build/fortran/hello_allreduce
!
! On a GPU communicator the buffer would be a device array's address (c_devloc in CUDA Fortran or
! OpenACC) and the stream the one the computation runs on.
program hello_allreduce
  use, intrinsic :: iso_c_binding
  use mpi_f08
  use gcomm
  implicit none
  integer, parameter :: n = 2**20
  real(c_float), allocatable, target :: x(:)
  type(c_ptr) :: comm
  integer(c_int) :: rank, nranks

  call MPI_Init()
  call check(gcommCommInitMPI(comm, MPI_COMM_WORLD, c_null_ptr)) ! MPI bootstraps, then stays off
  call check(gcommCommUserRank(comm, rank))
  call check(gcommCommCount(comm, nranks))

  allocate(x(n))
  x = real(rank, c_float)
  ! in place, returns at once
  call check(gcommAllReduce(c_loc(x), c_loc(x), int(n, c_size_t), gcommFloat32, gcommSum, comm, &
                            c_null_ptr))
  ! ... the application's own work overlaps the reduction here ...
  call check(gcommWait(comm, c_null_ptr)) ! complete

  if (rank == 0) print '(a,g0,a,g0,a,i0,a)', 'x(1) = ', x(1), ' (expected ', &
                        nranks*(nranks - 1)/2.0, ') on ', nranks, ' ranks'
  deallocate(x)
  call check(gcommCommDestroy(comm))
  call MPI_Finalize()

contains

  subroutine check(res)
    integer(c_int), intent(in) :: res
    if (res /= gcommSuccess) then
      print '(a)', 'gcomm failed: '//gcommGetLastError(comm)
      call MPI_Abort(MPI_COMM_WORLD, 1)
    end if
  end subroutine check
end program hello_allreduce
